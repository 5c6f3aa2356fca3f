//! Batch-axis operations on the opaque memory and state tensors: first-step zero state and
//! row selection. Any element type is handled the same way, so a state can be f32 (KV
//! caches), i64 or bool (masks) without the server knowing what it means.

use ort::value::{DynValue, PrimitiveTensorElementType, Tensor, TensorElementType};

/// Element types the server can create and slice.
pub const SUPPORTED_TYPES: &[TensorElementType] = &[
    TensorElementType::Float32,
    TensorElementType::Float64,
    TensorElementType::Int64,
    TensorElementType::Int32,
    TensorElementType::Int8,
    TensorElementType::Uint8,
    TensorElementType::Bool,
];

/// Rows `keep` of a row-major tensor of shape `dims` (axis 0 is the batch), in that order.
/// Returns the new shape and data. `None` if an index is out of range or `data` does not
/// match `dims`.
pub fn gather_rows<T: Clone>(
    data: &[T],
    dims: &[usize],
    keep: &[usize],
) -> Option<(Vec<usize>, Vec<T>)> {
    let (&rows, rest) = dims.split_first()?;
    let row_len: usize = rest.iter().product();
    if data.len() != rows * row_len || keep.iter().any(|&r| r >= rows) {
        return None;
    }
    let mut out = Vec::with_capacity(keep.len() * row_len);
    for &r in keep {
        out.extend_from_slice(&data[r * row_len..(r + 1) * row_len]);
    }
    let mut new_dims = dims.to_vec();
    new_dims[0] = keep.len();
    Some((new_dims, out))
}

fn select_typed<T>(value: &DynValue, keep: &[usize]) -> Result<DynValue, String>
where
    T: PrimitiveTensorElementType + Clone + std::fmt::Debug + 'static,
{
    let (shape, data) = value.try_extract_tensor::<T>().map_err(|e| e.to_string())?;
    let dims: Vec<usize> = shape.iter().map(|&d| d.max(0) as usize).collect();
    let (new_dims, out) = gather_rows(data, &dims, keep)
        .ok_or_else(|| format!("cannot select rows {keep:?} of a tensor of shape {dims:?}"))?;
    Tensor::from_array((new_dims, out))
        .map(|t| t.into_dyn())
        .map_err(|e| e.to_string())
}

/// Rows `keep` of a batch-first tensor, as a new tensor.
pub fn select_rows(value: &DynValue, keep: &[usize]) -> Result<DynValue, String> {
    match value.dtype().tensor_type() {
        Some(TensorElementType::Float32) => select_typed::<f32>(value, keep),
        Some(TensorElementType::Float64) => select_typed::<f64>(value, keep),
        Some(TensorElementType::Int64) => select_typed::<i64>(value, keep),
        Some(TensorElementType::Int32) => select_typed::<i32>(value, keep),
        Some(TensorElementType::Int8) => select_typed::<i8>(value, keep),
        Some(TensorElementType::Uint8) => select_typed::<u8>(value, keep),
        Some(TensorElementType::Bool) => select_typed::<bool>(value, keep),
        other => Err(format!("cannot select rows of a {other:?} value")),
    }
}

fn zeros_typed<T>(shape: &[usize]) -> Result<DynValue, String>
where
    T: PrimitiveTensorElementType + Clone + Default + std::fmt::Debug + 'static,
{
    let len = shape.iter().product();
    Tensor::from_array((shape.to_vec(), vec![T::default(); len]))
        .map(|t| t.into_dyn())
        .map_err(|e| e.to_string())
}

/// A zero-filled tensor (possibly with a 0-sized axis: the first step's empty KV cache).
pub fn zeros(ty: TensorElementType, shape: &[usize]) -> Result<DynValue, String> {
    match ty {
        TensorElementType::Float32 => zeros_typed::<f32>(shape),
        TensorElementType::Float64 => zeros_typed::<f64>(shape),
        TensorElementType::Int64 => zeros_typed::<i64>(shape),
        TensorElementType::Int32 => zeros_typed::<i32>(shape),
        TensorElementType::Int8 => zeros_typed::<i8>(shape),
        TensorElementType::Uint8 => zeros_typed::<u8>(shape),
        TensorElementType::Bool => zeros_typed::<bool>(shape),
        other => Err(format!("cannot create a {other:?} tensor")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathers_rows_in_the_given_order() {
        // shape [3, 2, 2]: row r holds 4r..4r+3
        let data: Vec<i32> = (0..12).collect();
        let (dims, out) = gather_rows(&data, &[3, 2, 2], &[2, 0]).unwrap();
        assert_eq!(dims, vec![2, 2, 2]);
        assert_eq!(out, vec![8, 9, 10, 11, 0, 1, 2, 3]);
    }

    #[test]
    fn gathers_rows_of_empty_time_axis() {
        // A first-step KV cache [batch=3, heads=2, time=0, dim=4] has no data at all.
        let data: Vec<f32> = Vec::new();
        let (dims, out) = gather_rows(&data, &[3, 2, 0, 4], &[1]).unwrap();
        assert_eq!(dims, vec![1, 2, 0, 4]);
        assert!(out.is_empty());
    }

    #[test]
    fn rejects_bad_rows_and_shapes() {
        let data = [1.0f32, 2.0, 3.0, 4.0];
        assert!(gather_rows(&data, &[2, 2], &[2]).is_none());
        assert!(gather_rows(&data, &[3, 2], &[0]).is_none());
        assert!(gather_rows(&data, &[], &[0]).is_none());
        let (dims, out) = gather_rows(&data, &[2, 2], &[]).unwrap();
        assert_eq!(dims, vec![0, 2]);
        assert!(out.is_empty());
    }
}
