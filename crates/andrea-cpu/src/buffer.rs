//! Host memory as backend memory.
//!
//! A [`CpuBuffer`] behaves like a device allocation: ops read and write it through
//! `Copy` views, so it lives in an `UnsafeCell`. It is `Send` but not `Sync`: a buffer,
//! and every view into it, is used by one thread at a time, and within an op
//! [`andrea_core::check`] has already proved that outputs do not overlap inputs. That is
//! what makes handing out a `&mut [f32]` for an output and `&[f32]` for the inputs sound.

use std::cell::UnsafeCell;

use andrea_core::{DeviceMemory, Matrix, View};

/// `f32` elements in host memory.
pub struct CpuBuffer<T = f32> {
    data: UnsafeCell<Box<[T]>>,
}

/// Element types for which all-zero bits are the value zero.
///
/// # Safety
/// An implementor's all-zero bit pattern must be a valid value.
pub unsafe trait ZeroBits: Copy {}
// SAFETY: 0.0 and 0 are all-zero bits.
unsafe impl ZeroBits for f32 {}
// SAFETY: as above.
unsafe impl ZeroBits for u32 {}
// SAFETY: as above (BF16's zero is all-zero bits).
unsafe impl ZeroBits for andrea_core::bf16 {}

/// `u32` token ids in host memory.
pub type CpuIds = CpuBuffer<u32>;

// SAFETY: the buffer owns its elements; moving it to another thread moves them.
unsafe impl<T: Send> Send for CpuBuffer<T> {}

impl<T: Copy + Default> CpuBuffer<T> {
    /// `len` zeros.
    pub fn zeros(len: usize) -> Self {
        CpuBuffer {
            data: UnsafeCell::new(vec![T::default(); len].into_boxed_slice()),
        }
    }

    /// `len` zeros, or `None` where the allocation fails (a size the user chose must be
    /// an error, not an abort). Zeroed by the allocator (`calloc`), as `vec![0; n]` is:
    /// large buffers get the kernel's zero pages, touched only when first written.
    pub fn try_zeros(len: usize) -> Option<Self>
    where
        T: ZeroBits,
    {
        let layout = std::alloc::Layout::array::<T>(len).ok()?;
        if layout.size() == 0 {
            return Some(Self::zeros(len));
        }
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
        if ptr.is_null() {
            return None;
        }
        // Before the first write: the pages are the kernel's zero pages until then.
        huge_pages::advise(ptr.cast(), layout.size());
        // SAFETY: `ptr` comes from the global allocator with the layout of `[T; len]`, and
        // all-zero bits are a valid `T` (`ZeroBits`), so this is a `Vec` of `len` zeros.
        let v = unsafe { Vec::from_raw_parts(ptr, len, len) };
        Some(CpuBuffer {
            data: UnsafeCell::new(v.into_boxed_slice()),
        })
    }

    /// A buffer holding a copy of `host`.
    pub fn from_slice(host: &[T]) -> Self {
        CpuBuffer {
            data: UnsafeCell::new(host.to_vec().into_boxed_slice()),
        }
    }
}

impl<T> DeviceMemory for CpuBuffer<T> {
    fn len(&self) -> usize {
        // SAFETY: reading the length of the box never races with element writes.
        unsafe { (&*self.data.get()).len() }
    }
}

impl<T> CpuBuffer<T> {
    /// Base pointer of the elements.
    pub(crate) fn ptr(&self) -> *mut T {
        // SAFETY: the box is never reallocated after construction.
        unsafe { (&mut *self.data.get()).as_mut_ptr() }
    }
}

/// The elements of a validated input view.
///
/// # Safety
/// `t` must have passed its op's check (in bounds), and no `&mut` to these elements may
/// be live while the returned slice is.
pub(crate) unsafe fn read<'a, T>(t: &View<'a, CpuBuffer<T>>) -> &'a [T] {
    // SAFETY: in bounds by the caller's check; no aliasing writer by the caller's contract.
    unsafe { std::slice::from_raw_parts(t.buf.ptr().add(t.offset), t.numel()) }
}

/// The elements of a validated output view.
///
/// # Safety
/// `t` must have passed its op's check (in bounds, disjoint from every other argument),
/// and no other reference to these elements may be live while the returned slice is.
#[allow(clippy::mut_from_ref)]
pub(crate) unsafe fn write<'a, T>(t: &View<'a, CpuBuffer<T>>) -> &'a mut [T] {
    // SAFETY: in bounds and exclusive by the caller's check and contract.
    unsafe { std::slice::from_raw_parts_mut(t.buf.ptr().add(t.offset), t.numel()) }
}

/// A raw pointer that may cross threads: the op that makes one has proved that the
/// elements each thread touches through it are disjoint.
#[derive(Clone, Copy)]
pub(crate) struct SendPtr(pub *mut f32);
// SAFETY: see the type's docs; disjointness is the creating op's obligation.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// Pointer to element `(0, 0, 0)` of a validated matrix.
    pub(crate) fn of(m: &Matrix<'_, CpuBuffer>) -> Self {
        // SAFETY: the matrix was checked to lie inside its buffer.
        SendPtr(unsafe { m.buf.ptr().add(m.offset) })
    }

    /// The raw pointer (a method, so closures capture the `Send` wrapper, not the field).
    #[inline]
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }

    /// `self + n` elements.
    ///
    /// # Safety
    /// The result must stay inside the allocation.
    #[inline]
    pub(crate) unsafe fn add(self, n: usize) -> Self {
        // SAFETY: the caller keeps the offset inside the allocation.
        SendPtr(unsafe { self.0.add(n) })
    }
}

/// Transparent huge pages for large buffers.
///
/// Streaming a large buffer through 4 KiB pages costs a TLB miss every 4 KiB, and the
/// CPU's stream prefetchers stop at each page boundary, so a large read stream runs
/// markedly faster on 2 MiB pages (`peaks` reports both). Decoding
/// reads every weight once per token, and the optimizer and gradient clipping stream
/// every parameter, so each buffer of at least [`huge_pages::MIN_BYTES`] is advised
/// `MADV_HUGEPAGE` (the 2 MiB-aligned part of it) before its first write. Advice only:
/// where the kernel has THP off (`never`) or cannot find a huge page, the memory is the
/// same ordinary memory. `ANDREA_HUGEPAGES=0` turns the advice off (to measure without).
pub(crate) mod huge_pages {
    /// Buffers smaller than this are left alone (a huge page would mostly hold nothing).
    pub(crate) const MIN_BYTES: usize = 8 << 20;
    const HUGE: usize = 2 << 20;

    /// Whether `ANDREA_HUGEPAGES` leaves the advice on ([`parse`]), read once.
    pub(crate) fn enabled() -> bool {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| {
            let value = std::env::var("ANDREA_HUGEPAGES").ok();
            let (on, warning) = parse(value.as_deref());
            if let Some(w) = warning {
                eprintln!("andrea-cpu: {w}");
            }
            on
        })
    }

    /// The advice is on when the variable is unset, `1`, `on` or `true`, off for `0`,
    /// `off` or `false`; anything else leaves it on with a warning to print, as a
    /// misspelt `ANDREA_SIMD` does.
    fn parse(value: Option<&str>) -> (bool, Option<String>) {
        let Some(value) = value else {
            return (true, None);
        };
        match value.trim().to_ascii_lowercase().as_str() {
            "0" | "off" | "false" => (false, None),
            "1" | "on" | "true" => (true, None),
            _ => (
                true,
                Some(format!(
                    "ignoring ANDREA_HUGEPAGES={value:?} (expected 0, off, false, 1, on or \
                     true); the advice stays on"
                )),
            ),
        }
    }

    #[cfg(test)]
    #[test]
    fn a_value_that_means_nothing_is_ignored_with_a_warning() {
        assert_eq!(parse(None), (true, None));
        assert_eq!(parse(Some(" OFF ")), (false, None));
        assert_eq!(parse(Some("0")), (false, None));
        assert_eq!(parse(Some("true")), (true, None));
        let (on, warning) = parse(Some("banana"));
        assert!(on);
        assert!(warning.unwrap().contains("ANDREA_HUGEPAGES=\"banana\""));
    }

    /// Advises `MADV_HUGEPAGE` for the whole 2 MiB pages inside `[ptr, ptr + bytes)`.
    pub(crate) fn advise(ptr: *mut u8, bytes: usize) {
        if bytes < MIN_BYTES || !enabled() {
            return;
        }
        let start = (ptr as usize).next_multiple_of(HUGE);
        let end = (ptr as usize + bytes) / HUGE * HUGE;
        #[cfg(target_os = "linux")]
        if start < end {
            // SAFETY: the range lies inside one live allocation of ours; MADV_HUGEPAGE is
            // advice that changes no contents and no access rights. Its result is
            // ignored: a kernel without THP answers EINVAL and the memory stays as it was.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
        // Other systems have no transparent huge pages to advise.
        #[cfg(not(target_os = "linux"))]
        let _ = (start, end);
    }
}

#[cfg(test)]
mod tests {
    use andrea_core::{MemoryOps, View};

    use crate::CpuBackend;

    /// Kilobytes of `AnonHugePages` over every mapping of `/proc/self/smaps` that overlaps
    /// `[lo, hi)` (advice splits a mapping, so the range may span several), or `None`
    /// where no mapping overlaps it or the file cannot be read.
    fn huge_kb_in(lo_buf: usize, hi_buf: usize) -> Option<usize> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut huge_kb = None::<usize>;
        let mut inside = false;
        for line in smaps.lines() {
            let head = line.split_whitespace().next().unwrap_or("");
            if let Some((lo, hi)) = head.split_once('-') {
                if let (Ok(lo), Ok(hi)) =
                    (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
                {
                    inside = lo < hi_buf && lo_buf < hi;
                    continue;
                }
            }
            if inside {
                if let Some(kb) = line.strip_prefix("AnonHugePages:") {
                    let kb = kb.trim().trim_end_matches("kB").trim().parse::<usize>();
                    *huge_kb.get_or_insert(0) += kb.unwrap_or(0);
                }
            }
        }
        huge_kb
    }

    /// Why this system cannot show the advice working, if it cannot: not Linux, THP not
    /// in `madvise` mode (`never` or `always`: nothing to tell apart), `ANDREA_HUGEPAGES`
    /// off, or a kernel (or an emulator such as `qemu-user`) that does not back memory
    /// advised `MADV_HUGEPAGE` by huge pages: a probe advises and writes 16 MiB of its
    /// own, without the backend, and looks for huge pages in it.
    fn why_huge_pages_cannot_be_seen() -> Option<String> {
        if !cfg!(target_os = "linux") {
            return Some("not Linux: no transparent huge pages".into());
        }
        let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        if !mode.contains("[madvise]") {
            return Some(format!(
                "transparent huge pages are not in madvise mode here ({:?})",
                mode.trim()
            ));
        }
        if !super::huge_pages::enabled() {
            return Some("ANDREA_HUGEPAGES turns the advice off".into());
        }
        #[cfg(target_os = "linux")]
        {
            const HUGE: usize = 2 << 20;
            let mut probe = vec![0u8; 16 << 20];
            let lo = (probe.as_ptr() as usize).next_multiple_of(HUGE);
            let hi = (probe.as_ptr() as usize + probe.len()) / HUGE * HUGE;
            // SAFETY: the range lies inside `probe`; the advice changes no contents.
            unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE) };
            probe.iter_mut().step_by(4096).for_each(|b| *b = 1);
            let got = huge_kb_in(lo, hi).unwrap_or(0);
            std::hint::black_box(&probe);
            if got == 0 {
                return Some(
                    "this kernel (or emulator) backs no memory advised MADV_HUGEPAGE by huge \
                     pages (a probe of 16 MiB got none)"
                        .into(),
                );
            }
        }
        None
    }

    /// A large backend buffer is backed by transparent huge pages once written, where the
    /// kernel offers them only on request (`madvise` mode: the advice is what makes the
    /// difference, so dropping it fails this test). Skipped, saying why, where the
    /// system cannot show it ([`why_huge_pages_cannot_be_seen`]).
    #[test]
    fn large_buffers_get_huge_pages_when_the_kernel_asks_for_advice() {
        if let Some(why) = why_huge_pages_cannot_be_seen() {
            eprintln!("SKIPPED: {why}");
            return;
        }
        let be = CpuBackend::new();
        let len = 32 << 18; // 32 MiB of f32
        let buf = be.alloc(len).unwrap();
        be.fill(View::whole(&buf), 1.0).unwrap();
        let (lo_buf, hi_buf) = (buf.ptr() as usize, buf.ptr() as usize + 4 * len);
        let huge_kb = huge_kb_in(lo_buf, hi_buf).expect("the buffer's mapping in /proc/self/smaps");
        // At least half of the 32 MiB (the advice covers whole 2 MiB pages inside it; the
        // kernel may fall short of huge pages under memory pressure, not by half here).
        assert!(
            huge_kb >= 16 << 10,
            "a written 32 MiB buffer has {huge_kb} kB on huge pages, want at least 16384"
        );
    }

    /// `with_host_elements` hands out exactly the view's elements, and what `f` writes
    /// is what the buffer holds afterwards (the CPU all-reduce sends from it in place).
    #[test]
    fn host_elements_are_the_view_in_place() {
        let be = CpuBackend::new();
        let buf = be.alloc(6).unwrap();
        be.upload(&[0., 1., 2., 3., 4., 5.], View::whole(&buf))
            .unwrap();
        let mut seen = Vec::new();
        let ran = be
            .with_host_elements(View::new(&buf, 2, [3]), &mut |x| {
                seen = x.to_vec();
                x.iter_mut().for_each(|v| *v *= 10.0);
            })
            .unwrap();
        assert!(ran);
        assert_eq!(seen, [2., 3., 4.]);
        let mut out = [0.0; 6];
        be.download(View::whole(&buf), &mut out).unwrap();
        assert_eq!(out, [0., 1., 20., 30., 40., 5.]);
        // Out of bounds is the same error as a download's.
        let e = be
            .with_host_elements(View::new(&buf, 4, [3]), &mut |_| {})
            .unwrap_err();
        assert!(e.to_string().contains("download"), "{e}");
    }
}
