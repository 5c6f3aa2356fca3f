//! Batch-axis operations on the opaque memory and state tensors: first-step zero state, row
//! selection, stacking rows that join a running batch, and trimming unused cache columns. Any element type is handled the same way, so a state can be f32 (KV
//! caches), i64 or bool (masks) without the server knowing what it means.

use ndarray::{ArrayD, ArrayViewD, Axis, IxDyn, Slice};
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

/// Runs `$f::<T>($args)` for the Rust type `T` of a runtime element type.
macro_rules! for_element_type {
    ($ty:expr, $f:ident($($arg:expr),*)) => {
        match $ty {
            Some(TensorElementType::Float32) => $f::<f32>($($arg),*),
            Some(TensorElementType::Float64) => $f::<f64>($($arg),*),
            Some(TensorElementType::Int64) => $f::<i64>($($arg),*),
            Some(TensorElementType::Int32) => $f::<i32>($($arg),*),
            Some(TensorElementType::Int8) => $f::<i8>($($arg),*),
            Some(TensorElementType::Uint8) => $f::<u8>($($arg),*),
            Some(TensorElementType::Bool) => $f::<bool>($($arg),*),
            other => Err(format!("unsupported tensor element type {other:?}")),
        }
    };
}

/// What every element type the server handles can do.
trait Element: PrimitiveTensorElementType + Clone + Default + std::fmt::Debug + 'static {}
impl<T: PrimitiveTensorElementType + Clone + Default + std::fmt::Debug + 'static> Element for T {}

fn to_value<T: Element>(array: ArrayD<T>) -> Result<DynValue, String> {
    Tensor::from_array(array)
        .map(|t| t.into_dyn())
        .map_err(|e| e.to_string())
}

fn select_typed<T: Element>(value: &DynValue, keep: &[usize]) -> Result<DynValue, String> {
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
    for_element_type!(value.dtype().tensor_type(), select_typed(value, keep))
}

fn zeros_typed<T: Element>(shape: &[usize]) -> Result<DynValue, String> {
    to_value(ArrayD::<T>::default(IxDyn(shape)))
}

/// A zero-filled tensor (possibly with a 0-sized axis: the first step's empty KV cache).
pub fn zeros(ty: TensorElementType, shape: &[usize]) -> Result<DynValue, String> {
    for_element_type!(Some(ty), zeros_typed(shape))
}

/// `first` and `second` stacked along axis 0, each zero-padded at the end of every other
/// axis to the larger of the two sizes. Zero padding is "absent" under the decoder-step
/// contract (a 0 in a mask), which is what lets rows of different source lengths and cache
/// lengths share a batch.
pub fn pad_and_stack<T: Clone + Default>(
    first: &ArrayViewD<'_, T>,
    second: &ArrayViewD<'_, T>,
) -> ArrayD<T> {
    let shape: Vec<usize> = (0..first.ndim())
        .map(|axis| {
            if axis == 0 {
                first.shape()[0] + second.shape()[0]
            } else {
                first.shape()[axis].max(second.shape()[axis])
            }
        })
        .collect();
    let mut out = ArrayD::<T>::default(IxDyn(&shape));
    let rows = first.shape()[0];
    for (part, offset) in [(first, 0), (second, rows)] {
        out.slice_each_axis_mut(|ax| {
            let axis = ax.axis.index();
            if axis == 0 {
                Slice::from(offset..offset + part.shape()[0])
            } else {
                Slice::from(0..part.shape()[axis])
            }
        })
        .assign(part);
    }
    out
}

fn concat_typed<T: Element>(first: &DynValue, second: &DynValue) -> Result<DynValue, String> {
    let a = first.try_extract_array::<T>().map_err(|e| e.to_string())?;
    let b = second.try_extract_array::<T>().map_err(|e| e.to_string())?;
    if a.ndim() != b.ndim() || a.ndim() == 0 {
        return Err(format!(
            "cannot stack tensors of shapes {:?} and {:?}",
            a.shape(),
            b.shape()
        ));
    }
    to_value(pad_and_stack(&a, &b))
}

/// The rows of `first` followed by the rows of `second`, zero-padded to a common shape (see
/// [`pad_and_stack`]).
pub fn concat_rows(first: &DynValue, second: &DynValue) -> Result<DynValue, String> {
    let (ta, tb) = (first.dtype().tensor_type(), second.dtype().tensor_type());
    if ta != tb {
        return Err(format!("cannot stack a {ta:?} tensor onto a {tb:?} tensor"));
    }
    for_element_type!(ta, concat_typed(first, second))
}

fn drop_leading_typed<T: Element>(
    value: &DynValue,
    axis: usize,
    count: usize,
) -> Result<DynValue, String> {
    let a = value.try_extract_array::<T>().map_err(|e| e.to_string())?;
    if axis >= a.ndim() || count > a.shape()[axis] {
        return Err(format!(
            "cannot drop {count} leading entries of axis {axis} from shape {:?}",
            a.shape()
        ));
    }
    to_value(a.slice_axis(Axis(axis), Slice::from(count..)).to_owned())
}

/// `value` without the first `count` entries of `axis` (cache columns no live row uses).
pub fn drop_leading(value: &DynValue, axis: usize, count: usize) -> Result<DynValue, String> {
    for_element_type!(
        value.dtype().tensor_type(),
        drop_leading_typed(value, axis, count)
    )
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
    fn stacking_pads_every_other_axis_at_the_end() {
        // A running row with a 3-column cache and a new row with none; sources of 1 and 2.
        let old = ndarray::arr2(&[[1.0f32, 1.0, 1.0]]).into_dyn();
        let new = ArrayD::<f32>::zeros(IxDyn(&[2, 0]));
        let out = pad_and_stack(&old.view(), &new.view());
        assert_eq!(out.shape(), &[3, 3]);
        assert_eq!(
            out.as_slice().unwrap(),
            &[1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        );
        let short = ndarray::arr2(&[[7i64]]).into_dyn();
        let long = ndarray::arr2(&[[8i64, 9]]).into_dyn();
        let out = pad_and_stack(&short.view(), &long.view());
        assert_eq!(out, ndarray::arr2(&[[7i64, 0], [8, 9]]).into_dyn());
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
