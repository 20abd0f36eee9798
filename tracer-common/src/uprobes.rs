//! The CUDA and request-marker uprobes: attach cookies and per-thread accounting.

/// libcuda entry points the uprobes attach to; the discriminant is the attach cookie.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudaFn {
    LaunchKernel = 0,
    LaunchKernelPtsz = 1,
    LaunchKernelEx = 2,
    LaunchKernelExPtsz = 3,
    StreamSynchronize = 4,
    StreamSynchronizePtsz = 5,
    CtxSynchronize = 6,
    EventSynchronize = 7,
    /// A synchronous device-to-host copy.
    MemcpyDtoH = 8,
    MemcpyDtoHPtds = 9,
    /// The runtime API (libcudart), which frameworks call: it may reach the driver through
    /// private entry points that are not the exported symbols above.
    RtDeviceSynchronize = 10,
    RtStreamSynchronize = 11,
    RtEventSynchronize = 12,
    /// cudaMemcpy: synchronous whatever its direction.
    RtMemcpy = 13,
}

impl CudaFn {
    pub const ALL: [CudaFn; 14] = [
        Self::LaunchKernel,
        Self::LaunchKernelPtsz,
        Self::LaunchKernelEx,
        Self::LaunchKernelExPtsz,
        Self::StreamSynchronize,
        Self::StreamSynchronizePtsz,
        Self::CtxSynchronize,
        Self::EventSynchronize,
        Self::MemcpyDtoH,
        Self::MemcpyDtoHPtds,
        Self::RtDeviceSynchronize,
        Self::RtStreamSynchronize,
        Self::RtEventSynchronize,
        Self::RtMemcpy,
    ];

    /// Whether the function belongs to the runtime library (libcudart) rather than libcuda.
    pub const fn runtime(self) -> bool {
        (self as u32) >= Self::RtDeviceSynchronize as u32
    }

    /// The exported symbol.
    pub const fn symbol(self) -> &'static str {
        match self {
            Self::LaunchKernel => "cuLaunchKernel",
            Self::LaunchKernelPtsz => "cuLaunchKernel_ptsz",
            Self::LaunchKernelEx => "cuLaunchKernelEx",
            Self::LaunchKernelExPtsz => "cuLaunchKernelEx_ptsz",
            Self::StreamSynchronize => "cuStreamSynchronize",
            Self::StreamSynchronizePtsz => "cuStreamSynchronize_ptsz",
            Self::CtxSynchronize => "cuCtxSynchronize",
            Self::EventSynchronize => "cuEventSynchronize",
            Self::MemcpyDtoH => "cuMemcpyDtoH_v2",
            Self::MemcpyDtoHPtds => "cuMemcpyDtoH_v2_ptds",
            Self::RtDeviceSynchronize => "cudaDeviceSynchronize",
            Self::RtStreamSynchronize => "cudaStreamSynchronize",
            Self::RtEventSynchronize => "cudaEventSynchronize",
            Self::RtMemcpy => "cudaMemcpy",
        }
    }

    /// Whether the call blocks the calling thread until the GPU has caught up.
    pub const fn synchronizes(self) -> bool {
        (self as u32) >= Self::StreamSynchronize as u32
    }
}

impl TryFrom<u32> for CudaFn {
    type Error = u32;
    fn try_from(v: u32) -> Result<Self, u32> {
        Self::ALL.get(v as usize).copied().ok_or(v)
    }
}

/// Per-thread CUDA call accounting, keyed by TID.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaThread {
    pub launches: u64,
    /// Completed synchronizing calls (outermost only: libcuda may call its own exported
    /// functions from inside one).
    pub sync_calls: u64,
    pub sync_ns: u64,
    pub sync_max_ns: u64,
    /// Entry time of the synchronizing call in progress (valid while `depth > 0`).
    pub sync_start_ns: u64,
    pub sync_fn: u32,
    pub depth: u32,
    /// The stack pointer and return address at the outermost call's entry. A later entry
    /// above that stack pointer, or while that slot still holds the return address (the
    /// return probe replaces it with its trampoline, so the call was entered without one, or
    /// this is a new call from the same call site), means that call ended without its return
    /// probe firing (longjmp, an exception, a thread cancellation; a call entered between the
    /// attachment of the two probes, before the return probe came first), and would otherwise
    /// keep `depth` above 0 for good, hiding every later call. Not caught: a later call from a
    /// deeper frame of another path, which overwrites the slot (learning the trampoline's
    /// address would catch it).
    pub sync_sp: u64,
    pub sync_ret: u64,
    /// Calls whose return went unseen that way, found at the thread's next call.
    pub lost_returns: u64,
}

/// `Config::request_id_arg` when the marker functions carry no request id.
pub const NO_REQUEST_ID: u32 = u32::MAX;

/// The attach cookie of a USDT probe of the garbage collector (`python:gc__start`,
/// `python:gc__done`): which probe it is and where its argument is, decoded from the probe's
/// argument spec (`-4@112(%rsp)`, `-8@%r12`) by userspace. Bits 0-7: `GC_START`/`GC_DONE`;
/// 8-15: the register, as the index of its 8-byte slot in `struct pt_regs` (`GC_ARG_NONE`:
/// no argument read); bit 16: the argument is in memory at register + offset; 17-20: its size
/// in bytes; bits 32-63: the offset (signed).
pub const GC_START: u64 = 0;
pub const GC_DONE: u64 = 1;
pub const GC_ARG_NONE: u64 = 0xff;
pub const GC_ARG_MEMORY: u64 = 1 << 16;

pub const fn gc_cookie(kind: u64, reg: u64, memory: bool, size: u64, offset: i32) -> u64 {
    kind | (reg << 8)
        | if memory { GC_ARG_MEMORY } else { 0 }
        | ((size & 0xf) << 17)
        | ((offset as u32 as u64) << 32)
}
