//! Schemas for the generated OpenAPI document (the HTTP API's `ApiDoc`) of types that cannot
//! derive `utoipa::ToSchema` here: the model package's enums that `GET /models` shows, and
//! the engine's that a translation reports (the engine links no web framework).
//!
//! Their variants are read from their own `Deserialize` implementations (serde hands every
//! deserializer an enum's name and its variants' names, renamed as on the wire), so the
//! document lists exactly what the server sends, without `model-package` or `nmt-engine`
//! depending on utoipa.

use std::borrow::Cow;

use serde::de::{self, DeserializeOwned, Deserializer, Visitor};
use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaType, Type};
use utoipa::openapi::RefOr;

/// A unit-only enum as serde writes it: its name and its variants' names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SerdeEnum {
    pub name: &'static str,
    pub variants: &'static [&'static str],
}

/// The name and variants `T`'s `Deserialize` implementation declares; `None` when `T` does
/// not deserialize as an enum.
pub fn serde_enum<T: DeserializeOwned>() -> Option<SerdeEnum> {
    let mut found = None;
    // It always fails: it only records what the implementation asks for.
    let _ = T::deserialize(EnumNames(&mut found));
    found
}

/// A deserializer that answers nothing and records an enum's names.
struct EnumNames<'a>(&'a mut Option<SerdeEnum>);

impl<'de> Deserializer<'de> for EnumNames<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("not an enum"))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = Some(SerdeEnum { name, variants });
        Err(de::Error::custom("names recorded"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct identifier
        ignored_any
    }
}

/// `{"type": "string", "enum": [...]}` of a unit-only enum.
fn string_enum(names: SerdeEnum) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(SchemaType::new(Type::String))
        .enum_values(Some(names.variants.iter().copied()))
        .into()
}

/// For each `Marker => Enum`: a `Marker` type whose schema is `Enum`'s, named as serde names
/// it, to put in `#[schema(value_type = Marker)]` where a field has type `Enum`.
macro_rules! foreign_enums {
    ($($(#[$doc:meta])* $marker:ident => $enum:ty,)*) => {$(
        $(#[$doc])*
        pub struct $marker;

        impl utoipa::PartialSchema for $marker {
            fn schema() -> RefOr<Schema> {
                string_enum(Self::names())
            }
        }

        impl utoipa::ToSchema for $marker {
            fn name() -> Cow<'static, str> {
                Cow::Borrowed(Self::names().name)
            }
        }

        impl $marker {
            fn names() -> SerdeEnum {
                serde_enum::<$enum>()
                    .expect(concat!(stringify!($enum), " deserializes as an enum"))
            }
        }
    )*};
}

foreign_enums! {
    /// [`model_package::Architecture`].
    ArchitectureSchema => model_package::Architecture,
    /// [`model_package::AbsolutePosition`].
    AbsolutePositionSchema => model_package::AbsolutePosition,
    /// [`model_package::RelativeAttention`].
    RelativeAttentionSchema => model_package::RelativeAttention,
    /// [`model_package::RecurrentPosition`].
    RecurrentPositionSchema => model_package::RecurrentPosition,
    /// [`model_package::LengthEncoding`].
    LengthEncodingSchema => model_package::LengthEncoding,
    /// [`model_package::Precision`].
    PrecisionSchema => model_package::Precision,
    /// [`nmt_engine::length::LengthMode`]: how a target length is met (`soft`: the length
    /// encoding guides a length-aware decoder; `exact`: EOS is masked before the length and
    /// forced at it).
    LengthModeSchema => nmt_engine::length::LengthMode,
    /// [`nmt_engine::length::LengthSource`]: where a text's target length came from.
    LengthSourceSchema => nmt_engine::length::LengthSource,
    /// [`nmt_engine::limits::LimitSource`]: whose input limit applies (`model`: the model's
    /// own, from its absolute positions; `server`: `--max-input-tokens`).
    LimitSourceSchema => nmt_engine::limits::LimitSource,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;

    /// Every name serde declares is accepted and written back the same.
    fn round_trips<T: DeserializeOwned + Serialize>() -> Vec<&'static str> {
        let names = serde_enum::<T>().expect("an enum");
        for &variant in names.variants {
            let value: T = serde_json::from_value(variant.into()).unwrap();
            assert_eq!(serde_json::to_value(value).unwrap(), variant);
        }
        names.variants.to_vec()
    }

    #[test]
    fn the_model_package_enums_are_read_as_serde_writes_them() {
        use model_package::*;
        assert!(round_trips::<Architecture>().contains(&"rnn_nmt"));
        assert!(round_trips::<AbsolutePosition>().contains(&"sinusoidal"));
        assert!(round_trips::<RelativeAttention>().contains(&"keys_values"));
        assert!(round_trips::<RecurrentPosition>().contains(&"rpe_head"));
        assert!(round_trips::<LengthEncoding>().contains(&"ldpe"));
        assert_eq!(round_trips::<Precision>(), ["float32", "int8"]);
        assert_eq!(serde_enum::<Precision>().unwrap().name, "Precision");
        assert_eq!(serde_enum::<String>(), None);
        use nmt_engine::length::{LengthMode, LengthSource};
        assert_eq!(round_trips::<LengthMode>(), ["soft", "exact"]);
        assert!(round_trips::<LengthSource>().contains(&"max_chars"));
        assert_eq!(
            round_trips::<nmt_engine::limits::LimitSource>(),
            ["model", "server"]
        );
    }
}
