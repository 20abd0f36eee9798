//! Signals once the window has closed. During the window SIGINT and SIGTERM end the recording
//! and the tool reports it (session.rs, through tokio). After that, the tool is only
//! finishing: reading the kernel maps, analysing, writing files, which can take seconds for a
//! large process. A signal then must end it at once, not be swallowed by a handler nobody
//! polls any more: it prints what it leaves behind and exits 130 (SIGINT) or 143 (SIGTERM),
//! as a shell reports a command killed by them. A signal that comes while a file is being
//! written waits for it (`Deferred`), so an output is complete or absent, never half-written.

use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32, Ordering};

/// What to print when a signal ends the tool: leaked, never freed, so the handler can read it
/// at any moment.
static MESSAGE: AtomicPtr<Vec<u8>> = AtomicPtr::new(std::ptr::null_mut());

extern "C" fn on_signal(sig: libc::c_int) {
    if WRITING.load(Ordering::Acquire) > 0 {
        PENDING.store(sig, Ordering::Release);
        return;
    }
    let msg = MESSAGE.load(Ordering::Acquire);
    if !msg.is_null() {
        // SAFETY: the pointer came from Box::leak and is never freed or changed in place.
        let msg = unsafe { &*msg };
        // SAFETY: write(2) and _exit(2) are async-signal-safe; the buffer is live.
        unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
    }
    // SAFETY: as above.
    unsafe { libc::_exit(128 + sig) };
}

/// From now on SIGINT and SIGTERM end the tool at once; `left` says what it leaves behind
/// (where the trace file is, and in what state).
pub fn exit_on_interrupt(left: &str) {
    let text = format!("\ntracer: interrupted after the recording; {left}\n");
    let leaked: &'static mut Vec<u8> = Box::leak(Box::new(
        crate::recording::terminal_safe(&text)
            .into_owned()
            .into_bytes(),
    ));
    MESSAGE.store(leaked, Ordering::Release);
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: installing a handler that only calls async-signal-safe functions; the
        // zeroed sigaction has an empty mask and no flags.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Files being written now; a signal that arrives meanwhile waits for them.
static WRITING: AtomicU32 = AtomicU32::new(0);
/// A signal that arrived while a file was being written.
static PENDING: AtomicI32 = AtomicI32::new(0);

/// SIGINT and SIGTERM held back while it lives: a file being written and renamed into place
/// is finished first, whichever thread the signal is delivered to.
pub struct Deferred(());

impl Deferred {
    pub fn new() -> Self {
        WRITING.fetch_add(1, Ordering::AcqRel);
        Self(())
    }
}

impl Default for Deferred {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        if WRITING.fetch_sub(1, Ordering::AcqRel) == 1 {
            let sig = PENDING.swap(0, Ordering::AcqRel);
            if sig != 0 {
                on_signal(sig);
            }
        }
    }
}
