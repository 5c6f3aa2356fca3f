//! What `nmt-eval` shares with the other tools: its charts ([`chart`]), which `nmt-bench`
//! draws too.

pub mod chart;
