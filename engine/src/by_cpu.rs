//! Hot loops compiled for more than the baseline x86-64 (SSE2) that the binaries target, and
//! picked by the CPU they run on.
//!
//! The loops are written in plain Rust over fixed lanes (sixteen partial sums, sixteen running
//! maxima), which the compiler turns into vector instructions as wide as the features a copy
//! is compiled for. Rust never fuses a multiply and an add on its own, so every copy does the
//! same operations in the same order and gives the same bits: a CPU's choice changes speed,
//! never a translation.

/// Defines `fn $name(args) -> ret` that runs `$lanes(args)` compiled for AVX-512 (F, BW, VL)
/// where the CPU has it, else for AVX2, else for the baseline. `$lanes` should be
/// `#[inline(always)]` so that each copy gets its own compilation.
macro_rules! by_cpu {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? => $lanes:path) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                    $lanes($($arg),*)
                }
                #[target_feature(enable = "avx2")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    $lanes($($arg),*)
                }
                if $crate::by_cpu::has_avx512() {
                    // Safety: the CPU has the features this copy is compiled for.
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // Safety: as above.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $lanes($($arg),*)
        }
    };
}

pub(crate) use by_cpu;

/// Whether the CPU has the AVX-512 subsets [`by_cpu`]'s widest copy is compiled for.
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx512() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
}
