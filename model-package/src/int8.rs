//! What an int8 package's weights need from the CPU that runs them.
//!
//! ONNX Runtime multiplies the uint8 activations by the int8 weights with VNNI's `vpdpbusd`
//! where the CPU has it, which sums in 32 bits. Without VNNI, x86 CPUs use `vpmaddubsw`,
//! which adds two products in 16 bits and saturates: with activations up to 255, weights
//! within ±63 (7 bits) never saturate, full 8-bit weights (±127) can. `nmt-export quantize`
//! picks the range for the CPU it runs on and records it in the manifest's `quantization`
//! record under [`WEIGHT_BITS`]; the engine warns when a package's range does not suit the
//! CPU serving it.

/// Key of the weight range (7 or 8) in `Manifest::quantization`. Packages without it were
/// quantized with 7-bit weights.
pub const WEIGHT_BITS: &str = "weight_bits";

/// Whether this CPU sums uint8 x int8 products without 16-bit saturation: x86 with
/// AVX512-VNNI or AVX-VNNI, or any CPU that is not x86 (ONNX Runtime's ARM kernels widen
/// before adding).
pub fn cpu_sums_int8_products_exactly() -> bool {
    #[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
    {
        std::arch::is_x86_feature_detected!("avx512vnni")
            || std::arch::is_x86_feature_detected!("avxvnni")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "x86")))]
    {
        true
    }
}

/// The weight range that suits this CPU: 8 bits where products are summed exactly, else 7.
pub fn weight_bits_for_this_cpu() -> u8 {
    if cpu_sums_int8_products_exactly() {
        8
    } else {
        7
    }
}

/// The weight range a package's quantization record names (7 for records that predate it).
pub fn weight_bits_of(quantization: &serde_json::Value) -> u8 {
    quantization
        .get(WEIGHT_BITS)
        .and_then(serde_json::Value::as_u64)
        .map_or(7, |bits| bits as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_without_a_range_are_7_bit() {
        assert_eq!(weight_bits_of(&serde_json::Value::Null), 7);
        assert_eq!(weight_bits_of(&serde_json::json!({ "weight_bits": 8 })), 8);
        assert!([7, 8].contains(&weight_bits_for_this_cpu()));
    }
}
