//! `nmt-bench`'s library: the benchmarks of `nmt-server` and what they share, for the two
//! binaries, `nmt-bench` (`src/main.rs`) and `nmt-bench-worker` (`src/bin/`).
//!
//! - [`batching`]: the default benchmark, throughput and latency by concurrency for each
//!   batching mode, every mode's server side by side and the cells interleaved.
//! - [`overload`]: `nmt-bench overload`, open-loop request rates against one server (started
//!   like these, or already running), to see its admission control shed the load it cannot
//!   finish; `nmt-bench storm` (`overload::storm`), closed-loop clients of maximal requests,
//!   to see that every request it accepts is answered within its timeout.
//! - [`beside_large`]: `nmt-bench beside-large`, closed-loop clients of one verse per request
//!   alone, then beside one client of large requests (64 texts each), to see whether the large
//!   requests take the small ones' share of the batch.
//! - [`memory`]: `nmt-bench memory`, one server's resident memory against input length for
//!   each package given (one per position family), and whether it goes back after the answer.
//! - [`cli`]: the command line and the arguments every benchmark shares; [`server`]: the
//!   servers under test (through `nmt_testkit`); [`single_server`]: what the benchmarks
//!   against one server share; [`load`]: the clients and closed-loop load; [`stats`]: a cell's
//!   summary; [`report`]: what every report shares; [`verses`]: the inputs.
//!
//! These are benchmarks to run by hand on an otherwise idle machine, not tests.

pub mod batching;
pub mod beside_large;
pub mod cli;
pub mod load;
pub mod memory;
pub mod overload;
pub mod report;
pub mod server;
pub mod single_server;
pub mod stats;
pub mod verses;
