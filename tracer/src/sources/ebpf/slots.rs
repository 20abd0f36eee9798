//! The kernel's direct-mapped thread slots (tracer-ebpf `THREAD_SLOTS`), mapped into this
//! process: reading 4,096 slots through one system call each, every time dead threads are
//! reaped, would cost more than the recording itself.

use std::{
    os::fd::{AsFd as _, AsRawFd as _},
    ptr::NonNull,
};

use anyhow::{Context as _, Result, bail};
use aya::{Ebpf, maps::Map};
use tracer_common::{ThreadState, ThreadStats};

/// The kernel lays array elements out every `round_up(value_size, 8)` bytes.
const _: () = assert!(size_of::<ThreadStats>().is_multiple_of(8));

pub struct ThreadSlots {
    base: NonNull<ThreadStats>,
    count: usize,
    len: usize,
}

// SAFETY: the mapping belongs to the process and lives as long as this value; the kernel side
// writes it concurrently whichever thread reads it.
unsafe impl Send for ThreadSlots {}

impl ThreadSlots {
    /// Maps the `count` slots of the loaded `THREAD_SLOTS` map.
    pub fn map(ebpf: &Ebpf, count: u32) -> Result<Self> {
        let Some(Map::Array(data)) = ebpf.map("THREAD_SLOTS") else {
            bail!("THREAD_SLOTS map missing or not an array");
        };
        let count = count as usize;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let len = (count * size_of::<ThreadStats>()).div_ceil(page) * page;
        // SAFETY: a shared mapping of a BPF_F_MMAPABLE array's fd at offset 0, no longer than
        // the array (rounded up to a page, as the kernel allocates it).
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                data.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mapping THREAD_SLOTS");
        }
        Ok(Self {
            base: NonNull::new(ptr.cast()).context("mmap returned null")?,
            count,
            len,
        })
    }

    fn slot(&self, i: usize) -> *mut ThreadStats {
        // SAFETY: callers pass i < count, inside the mapping.
        unsafe { self.base.as_ptr().add(i) }
    }

    /// Copies of the slots in use. While the programs run (`tracer watch` reads them at every
    /// window) the kernel may be updating a slot as it is copied; a copy is taken until two
    /// in a row agree (a few tries), so that a thread's account is not half before and half
    /// after one event.
    pub fn used(&self) -> Vec<ThreadStats> {
        (0..self.count)
            .filter_map(|i| {
                let p = self.slot(i);
                // SAFETY: p is inside the mapping; volatile, since the kernel writes it.
                let tid = unsafe { std::ptr::read_volatile(&raw const (*p).tid) };
                (tid != 0).then(|| settled(p))
            })
            .collect()
    }

    /// Takes out the threads that have exited and switched out for the last time, freeing
    /// their slots for new threads.
    pub fn take_dead(&mut self) -> Vec<ThreadStats> {
        (0..self.count)
            .filter_map(|i| {
                let p = self.slot(i);
                // SAFETY: as in `used`. A dead thread's slot is not written by the kernel any
                // more (unless its TID is reused at this instant); `tid` 0 frees it, and the
                // kernel sets every field when it takes a free slot, in no set order. So the
                // state is cleared first: a scan that meets a slot being taken must not see
                // the new TID beside the old thread's Dead and free it again.
                unsafe {
                    let tid = std::ptr::read_volatile(&raw const (*p).tid);
                    let state = std::ptr::read_volatile(&raw const (*p).state);
                    if tid == 0 || state != ThreadState::Dead as u32 {
                        return None;
                    }
                    let t = std::ptr::read_volatile(p);
                    std::ptr::write_volatile(&raw mut (*p).state, ThreadState::Unknown as u32);
                    std::ptr::write_volatile(&raw mut (*p).tid, 0);
                    Some(t)
                }
            })
            .collect()
    }
}

impl ThreadSlots {
    /// The waker of the run of waits thread `tid` has not yet added to `WAKERS`, if the thread
    /// holds its slot (`count` is a power of two: the kernel side masks the TID).
    pub fn run_waker(&self, tid: u32) -> Option<u32> {
        let p = self.slot(tid as usize & (self.count - 1));
        // SAFETY: inside the mapping (masked); volatile, since the kernel writes it.
        unsafe {
            (std::ptr::read_volatile(&raw const (*p).tid) == tid)
                .then(|| std::ptr::read_volatile(&raw const (*p).run.waker_tid))
        }
    }
}

fn bytes(t: &ThreadStats) -> &[u8] {
    // SAFETY: ThreadStats is plain old data with explicit padding (tracer-common), so every
    // byte of it is initialized.
    unsafe {
        std::slice::from_raw_parts(
            (t as *const ThreadStats).cast::<u8>(),
            size_of::<ThreadStats>(),
        )
    }
}

/// A copy of `*p` that two consecutive reads agree on (at most four reads).
fn settled(p: *mut ThreadStats) -> ThreadStats {
    // SAFETY: callers pass a pointer inside the mapping; volatile, since the kernel writes it.
    let mut last = unsafe { std::ptr::read_volatile(p) };
    for _ in 0..3 {
        // SAFETY: as above.
        let again = unsafe { std::ptr::read_volatile(p) };
        if bytes(&again) == bytes(&last) {
            return again;
        }
        last = again;
    }
    last
}

impl Drop for ThreadSlots {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}
