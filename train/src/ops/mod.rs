//! Fused CPU kernels with hand-written backward passes, as candle custom ops.
//!
//! Composed from candle's elementwise ops, each of these allocates and walks its tensors a
//! dozen times forward and again backward; fused, it makes one or two passes. Each kernel is
//! tested against the composed ops it replaces, value and gradient.

pub mod cross_entropy;
