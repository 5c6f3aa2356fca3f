//! Training side of the project: corpus, tokenizer, candle models, training loop, checkpoints,
//! and the length predictor.

pub mod corpus;
pub mod fixture;
pub mod length;
pub mod model;
pub mod ops;
pub mod tokenizer;
pub mod train;

/// Start-up tuning of a process that trains: [`keep_freed_memory_in_heap`], and candle's
/// own elementwise thread pool off unless `CANDLE_NUM_THREADS` says otherwise. The heavy ops
/// (matrix products and the fused kernels of [`ops`]) run on rayon's pool; candle's second
/// pool, kept only for the few elementwise ops left, spins while it waits, and on two cores
/// that spinning took the time of the threads doing the work (measured: 2,640 against 2,830
/// target tokens/s with it off, and far worse while anything else ran). Call first thing in
/// `main`, before any thread starts.
pub fn tune_for_training() {
    keep_freed_memory_in_heap();
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
}

/// candle allocates a fresh buffer for every op's output. glibc serves large buffers with
/// `mmap` and unmaps them on free, so each op page-faults (and the kernel zeroes) its output
/// again: measured at 2x the forward time of the shipped model. Keeping freed memory in the
/// heap avoids that. Call once at start-up of a process that trains.
pub fn keep_freed_memory_in_heap() {
    // SAFETY: mallopt only changes allocator tuning parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}

/// Largest elementwise |a - b|, for tests that compare two computations of one tensor.
#[cfg(test)]
pub(crate) fn max_abs_diff(a: &candle_core::Tensor, b: &candle_core::Tensor) -> f32 {
    (a - b)
        .and_then(|d| d.abs())
        .and_then(|d| d.max_all())
        .and_then(|d| d.to_scalar::<f32>())
        .expect("comparable tensors")
}
