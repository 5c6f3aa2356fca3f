//! The rows of a running batch kept in place: one buffer per memory or state tensor, axis 0
//! the slot, every other axis with room for the largest row. A row that joins is written
//! into its slot, a step writes one cache column per row, and a row that leaves frees its
//! slot; no other row is copied. The decoder reads the first `width` slots as they lie, a
//! contiguous prefix of the buffer, without a copy.

use ndarray::{ArrayD, ArrayViewD, Axis, IxDyn, Slice};

/// Float32 rows `[slots, ..]` with spare room on every axis.
#[derive(Debug)]
pub struct SlotBuffer {
    data: ArrayD<f32>,
}

/// Slots are added this many at a time. Doubling the slot axis (as a `Vec` grows) left a
/// batch capped at 32 rows holding caches for up to 64 once it had grown past 17 (a buffer
/// keeps its room between requests): peak memory at 64 clients with 2 workers 349-365 MiB
/// then, 307-324 in eights, at the same speed; a batch of 32 grows its slot axis at most four
/// times in the server's life.
const SLOT_GRANULE: usize = 8;

/// How much room a cache's time axis gets when it must grow: a quarter more than needed,
/// rounded up to this many columns, so a cache is copied once every several steps rather
/// than every step, and the decoder reads at most a quarter of padding.
const TIME_GRANULE: usize = 16;

/// Room for `needed` columns of a cache that grows by one a step.
pub fn time_room(needed: usize) -> usize {
    (needed + needed / 4).div_ceil(TIME_GRANULE).max(1) * TIME_GRANULE
}

impl SlotBuffer {
    /// An empty buffer for rows of rank `row_rank` (the axes after the slot axis).
    pub fn new(row_rank: usize) -> Self {
        SlotBuffer {
            data: ArrayD::zeros(IxDyn(&vec![0; row_rank + 1])),
        }
    }

    /// Slots, then the room on each row axis.
    pub fn capacity(&self) -> &[usize] {
        self.data.shape()
    }

    /// Makes room for `slots` slots and for rows of `row_shape`: the slot axis grows to a
    /// multiple of [`SLOT_GRANULE`], every other axis to exactly what is asked. What the
    /// buffer holds is kept.
    pub fn reserve(&mut self, slots: usize, row_shape: &[usize]) {
        let capacity = self.data.shape();
        debug_assert_eq!(row_shape.len() + 1, capacity.len());
        let mut shape = capacity.to_vec();
        if slots > shape[0] {
            shape[0] = slots.next_multiple_of(SLOT_GRANULE);
        }
        for (room, &needed) in shape[1..].iter_mut().zip(row_shape) {
            *room = (*room).max(needed);
        }
        if shape != capacity {
            self.resize(&shape);
        }
    }

    /// Sets the room of row axis `axis` (0 = the first axis after the slots) to `room`,
    /// keeping what fits.
    pub fn set_room(&mut self, axis: usize, room: usize) {
        let mut shape = self.data.shape().to_vec();
        if shape[axis + 1] != room {
            shape[axis + 1] = room;
            self.resize(&shape);
        }
    }

    fn resize(&mut self, shape: &[usize]) {
        let mut data = ArrayD::zeros(IxDyn(shape));
        let kept: Vec<usize> = shape
            .iter()
            .zip(self.data.shape())
            .map(|(&a, &b)| a.min(b))
            .collect();
        let prefix = |axis: ndarray::AxisDescription| Slice::from(0..kept[axis.axis.index()]);
        data.slice_each_axis_mut(prefix)
            .assign(&self.data.slice_each_axis(prefix));
        self.data = data;
    }

    /// Writes `row` (no larger than the room on any axis) into `slot`, zeros around it.
    pub fn write_row(&mut self, slot: usize, row: &ArrayViewD<'_, f32>) {
        let mut target = self.data.index_axis_mut(Axis(0), slot);
        target.fill(0.0);
        target
            .slice_each_axis_mut(|axis| Slice::from(0..row.shape()[axis.axis.index()]))
            .assign(row);
    }

    /// Zeros `slot`.
    pub fn clear_row(&mut self, slot: usize) {
        self.data.index_axis_mut(Axis(0), slot).fill(0.0);
    }

    /// Copies slot `from` over slot `to`.
    pub fn copy_row(&mut self, from: usize, to: usize) {
        let row = self.data.index_axis(Axis(0), from).to_owned();
        self.data.index_axis_mut(Axis(0), to).assign(&row);
    }

    /// Writes one column a row: `columns` is `[rows, ..]`, each row shaped as the buffer's
    /// but of length 1 on row axis `axis`, and row `r`'s goes to index `at[r]` of that axis
    /// in slot `r`. By offsets into both tensors rather than two views a row and an
    /// element-wise `assign`: a decoder step writes one column a row and state, and
    /// ndarray works out a dynamic-rank view's shape and strides on every call.
    pub fn write_columns(&mut self, axis: usize, columns: &ArrayViewD<'_, f32>, at: &[usize]) {
        let shape = self.data.shape();
        let mut expected = shape.to_vec();
        expected[0] = at.len();
        expected[axis + 1] = 1;
        assert_eq!(
            columns.shape(),
            expected.as_slice(),
            "columns of the buffer's rows"
        );
        let outer: usize = shape[1..axis + 1].iter().product();
        let room = shape[axis + 1];
        let inner: usize = shape[axis + 2..].iter().product();
        let columns = columns.as_standard_layout();
        let from = columns.as_slice().expect("a standard layout");
        let to = self
            .data
            .as_slice_mut()
            .expect("a buffer is allocated in standard layout and never sliced");
        for (row, &index) in at.iter().enumerate() {
            assert!(index < room, "column {index} of a room of {room}");
            for o in 0..outer {
                let source = (row * outer + o) * inner;
                let target = ((row * outer + o) * room + index) * inner;
                to[target..target + inner].copy_from_slice(&from[source..source + inner]);
            }
        }
    }

    /// The first `width` slots, every row axis at its full room (contiguous: no copy).
    pub fn view(&self, width: usize) -> ArrayViewD<'_, f32> {
        self.data.slice_axis(Axis(0), Slice::from(0..width))
    }

    /// Overwrites the first `rows.shape()[0]` slots with `rows` (their exact shape).
    pub fn assign_rows(&mut self, rows: &ArrayViewD<'_, f32>) {
        self.data
            .slice_axis_mut(Axis(0), Slice::from(0..rows.shape()[0]))
            .assign(rows);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{array, ArrayView};

    #[test]
    fn rows_are_written_zero_padded_and_kept_when_the_buffer_grows() {
        let mut buffer = SlotBuffer::new(1);
        buffer.reserve(2, &[2]);
        buffer.write_row(0, &array![1.0, 2.0].into_dyn().view());
        buffer.write_row(1, &array![3.0].into_dyn().view());
        assert_eq!(buffer.view(2), array![[1.0, 2.0], [3.0, 0.0]].into_dyn());
        // A third, longer row: room for it (slots come in eights), the old rows kept.
        buffer.reserve(3, &[3]);
        assert_eq!(buffer.capacity(), &[8, 3]);
        buffer.reserve(9, &[3]);
        assert_eq!(buffer.capacity(), &[16, 3]);
        buffer.write_row(2, &array![4.0, 5.0, 6.0].into_dyn().view());
        assert_eq!(
            buffer.view(3),
            array![[1.0, 2.0, 0.0], [3.0, 0.0, 0.0], [4.0, 5.0, 6.0]].into_dyn()
        );
        // Writing a shorter row over a slot clears what was there.
        buffer.write_row(2, &array![7.0].into_dyn().view());
        assert_eq!(
            buffer.view(3).index_axis(Axis(0), 2),
            array![7.0, 0.0, 0.0].into_dyn()
        );
    }

    #[test]
    fn columns_rows_and_room() {
        // [slots, heads = 2, time, 1]
        let mut buffer = SlotBuffer::new(3);
        buffer.reserve(2, &[2, 3, 1]);
        // One column a row: slot 0's at time 1, slot 1's at time 0, then slot 1's at 2.
        let columns = |x: [f32; 2]| {
            ArrayView::from_shape((2, 2, 1, 1), &[x[0], -x[0], x[1], -x[1]])
                .unwrap()
                .into_dyn()
                .to_owned()
        };
        buffer.write_columns(1, &columns([9.0, 1.0]).view(), &[1, 0]);
        buffer.write_columns(1, &columns([9.0, 2.0]).view(), &[1, 2]);
        let row = |slot: usize| {
            let row = buffer.view(2).index_axis(Axis(0), slot).to_owned();
            row.into_shape_with_order((2, 3)).unwrap()
        };
        assert_eq!(row(0), array![[0.0, 9.0, 0.0], [0.0, -9.0, 0.0]]);
        assert_eq!(row(1), array![[1.0, 0.0, 2.0], [-1.0, 0.0, -2.0]]);
        buffer.copy_row(1, 0);
        assert_eq!(
            buffer.view(1),
            buffer.view(2).slice_axis(Axis(0), Slice::from(1..2))
        );
        buffer.set_room(1, 1);
        assert_eq!(buffer.capacity(), &[8, 2, 1, 1]);
        assert_eq!(
            buffer.view(1).iter().copied().collect::<Vec<_>>(),
            vec![1.0, -1.0]
        );
        buffer.clear_row(0);
        assert!(buffer.view(1).iter().all(|&x| x == 0.0));
        buffer.assign_rows(&ArrayD::from_elem(IxDyn(&[1, 2, 1, 1]), 5.0).view());
        assert!(buffer.view(1).iter().all(|&x| x == 5.0));
    }

    #[test]
    fn time_room_leaves_a_quarter_in_granules() {
        assert_eq!(time_room(0), 16);
        assert_eq!(time_room(1), 16);
        assert_eq!(time_room(13), 16);
        assert_eq!(time_room(14), 32);
        assert_eq!(time_room(100), 128);
    }
}
