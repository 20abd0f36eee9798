//! Zeroing without `memset`. Plain zeroing of more than a few bytes (`= [0; N]`, a struct
//! literal, `Default`) compiles to a call to compiler-builtins' `memset`, which in this object
//! is a loop over single bytes (a one-byte store and an increment, as the verifier's log of it
//! shows): run at every target switch where it sat in the counters' path, and walked byte by
//! byte by the verifier at every path through it (the classic switch program with the counter
//! reads went over its million instructions). Volatile word stores are not merged back into it.

/// Zeroes `T` a word at a time.
///
/// # Safety
/// `p` is valid for writes of a `T`, 8-aligned, and `T` is plain data of whole words that zero
/// bytes make valid.
#[inline(always)]
pub unsafe fn zero_words<T>(p: *mut T) {
    const { assert!(size_of::<T>().is_multiple_of(8) && align_of::<T>() >= 8) };
    let words = p.cast::<u64>();
    for i in 0..size_of::<T>() / 8 {
        // SAFETY: inside `*p`, as the caller promises.
        unsafe { words.add(i).write_volatile(0) };
    }
}
