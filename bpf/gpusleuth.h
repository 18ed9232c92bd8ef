/* SPDX-License-Identifier: Apache-2.0 OR GPL-2.0 */
/*
 * Record layouts shared by the eBPF programs (gpusleuth.bpf.c) and user space
 * (crates/sleuth-core/src/record.rs mirrors every struct here with #[repr(C)];
 * size and offset tests there keep both in step). Change both or neither.
 *
 * All timestamps are bpf_ktime_get_ns(): CLOCK_MONOTONIC nanoseconds.
 */
#ifndef GPUSLEUTH_H
#define GPUSLEUTH_H

#define GS_COMM_LEN 16
#define GS_NARGS 6
#define GS_MAX_CULPRITS 4
#define GS_CPU_HISTORY 8 /* power of two */

/* Record types: the first u32 of every ring-buffer record. */
#define GS_REC_CALL 1
#define GS_REC_WAIT 2
#define GS_REC_PROC 3
#define GS_REC_BLOCK 4
#define GS_REC_NCCL 5
#define GS_REC_STACK 6

/*
 * Attach cookie of a call probe, set per attach point by user space:
 *   bits  0..15  op id (sleuth-core's op table)
 *   bits 16..19  index + 1 of the argument that is an out-pointer to read at
 *                return (0 = none), e.g. cudaMalloc(void **devPtr, ...) -> 1
 *   bit  20      the op belongs to the runtime layer (libcudart)
 */
#define GS_COOKIE_OP(c) ((__u32)((c) & 0xffff))
#define GS_COOKIE_OUT_ARG(c) ((__u32)(((c) >> 16) & 0xf))
#define GS_COOKIE_RUNTIME (1ULL << 20)
/* PyTorch caching allocator: emit a gs_block (instead of a gs_call) with the
 * Block struct read from the return value (malloc) or from argument 1 at
 * entry (free, release_block: read before the allocator merges it away). */
#define GS_COOKIE_BLOCK_RET (1ULL << 21)
#define GS_COOKIE_BLOCK_ARG1 (1ULL << 22)
#define GS_BLOCK_WORDS 16
/* NCCL: emit a gs_nccl (instead of a gs_call) that also carries the caller's
 * stack words at entry (7th and later arguments: ncclAllReduce's stream,
 * ncclReduce's comm; or a struct passed by value: ncclCommInitRank's
 * ncclUniqueId). The out-pointer argument may be any of args 1..6. */
#define GS_COOKIE_NCCL (1ULL << 23)
#define GS_NCCL_STACK_WORDS 4
/* Capture the call site (native + Python stack) of every call of this op, not
 * only of failed or slow ones (allocations, frees, allocator blocks). */
#define GS_COOKIE_STACK (1ULL << 24)

/* gs_call.flags */
#define GS_CALL_NESTED 1    /* driver call made inside a runtime call on the same thread */
#define GS_CALL_OUT_VALID 2 /* `out` holds the value read through the out-pointer */

/* One completed CUDA call. */
struct gs_call {
	__u32 type; /* GS_REC_CALL */
	__u32 op;
	__u32 pid; /* tgid */
	__u32 tid;
	__u64 start_ns;
	__u64 end_ns;
	__u64 args[GS_NARGS]; /* first six integer argument registers at entry */
	__u64 out;            /* *args[out_arg] at return (the allocated pointer) */
	__s64 ret;            /* return register (cudaError_t / CUresult) */
	__u64 runnable_ns;    /* time inside the call spent runnable but not running */
	__u64 blocked_ns;     /* time inside the call spent blocked (S, D, ...) */
	__u32 flags;
	__u32 cpu;      /* CPU at return */
	__u64 stack_id; /* call site (a gs_stack id), 0 = none captured */
};

/* Wait kinds (gs_wait.kind). */
#define GS_WAIT_PREEMPTED 1 /* switched out while runnable: the CPU was taken */
#define GS_WAIT_BLOCKED 2   /* switched out sleeping, woken, then waited for a CPU */

struct gs_culprit {
	__u32 pid;
	__u32 tid;
	__u64 ns; /* runnable time of the waiting thread while this task held its CPU */
	char comm[GS_COMM_LEN];
};

/*
 * One off-CPU interval of a traced thread, emitted when it runs again.
 * blocked part = [off_ns, wake_ns), runnable part = [wake_ns, on_ns).
 * For a preemption wake_ns == off_ns.
 */
struct gs_wait {
	__u32 type; /* GS_REC_WAIT */
	__u32 kind;
	__u32 pid;
	__u32 tid;
	__u64 off_ns;
	__u64 wake_ns;
	__u64 on_ns;
	__u32 prev_state; /* raw task state at switch-out */
	__u32 cpu;        /* CPU it ran again on */
	__u32 n_culprits;
	__u32 pad;
	struct gs_culprit culprits[GS_MAX_CULPRITS];
	/* Who woke the thread (blocked waits), read at sched_waking in the
	 * waker's context; valid when waker_flags has GS_WAKER_KNOWN. */
	__u32 waker_pid;
	__u32 waker_tid;
	char waker_comm[GS_COMM_LEN];
	__u32 waker_flags;
	__u32 pad2;
};

/* gs_wait.waker_flags */
#define GS_WAKER_KNOWN 1 /* a sched_waking was seen while the thread slept */
#define GS_WAKER_IRQ 2   /* ...in interrupt context (timer, device): not a task's doing */

/* One caching-allocator event: the Block and its first GS_BLOCK_WORDS words. */
struct gs_block {
	__u32 type; /* GS_REC_BLOCK */
	__u32 op;
	__u32 pid;
	__u32 tid;
	__u64 start_ns;
	__u64 end_ns;
	__u64 requested; /* argument 1 (malloc: the size asked for) */
	__u64 block;     /* the Block* */
	__u64 words[GS_BLOCK_WORDS];
	__u64 stack_id; /* call site (a gs_stack id), 0 = none captured */
};

/*
 * Call sites. A stack is emitted once per distinct (process, frames): its id
 * is a hash of both, and calls/blocks carry the id. Native frames are return
 * addresses from a frame-pointer walk (bpf_get_stack); Python frames are the
 * calling thread's CPython frame chain as (code object, instruction) pairs,
 * resolved to file/function/line in user space.
 */
#define GS_NATIVE_DEPTH 32
#define GS_PY_DEPTH 64
#define GS_PY_MAX_THREADS 64 /* thread states scanned to find the caller's */

/* gs_stack.flags */
#define GS_STACK_NATIVE_FULL 1 /* native frames filled GS_NATIVE_DEPTH: may be truncated */
#define GS_STACK_NATIVE_ERR 2  /* the user stack could not be read */
#define GS_STACK_PY 4          /* the process runs a recognised CPython */
#define GS_STACK_PY_TRUNC 8    /* more Python frames than GS_PY_DEPTH (outermost dropped) */
#define GS_STACK_PY_NO_THREAD 16 /* CPython process, but this thread has no thread state */

/* Python frame: the code object (0: a shim frame, skipped) and the raw
 * 8 bytes of the frame's instruction field (3.10: f_lasti, an int in the low
 * half; 3.11+: the instruction pointer). */
struct gs_py_frame {
	__u64 code;
	__u64 instr;
};

struct gs_stack {
	__u32 type; /* GS_REC_STACK */
	__u32 pid;
	__u64 id;
	__u32 n_native;
	__u32 n_py;
	__u32 flags;
	__u32 pad;
	__u64 native[GS_NATIVE_DEPTH]; /* innermost first */
	struct gs_py_frame py[GS_PY_DEPTH]; /* innermost first */
};

/* How to walk one process's CPython frames (set by user space per tgid). */
#define GS_PY_FRAMES_310 1 /* tstate->frame: PyFrameObject chain (f_back, f_code, f_lasti) */
#define GS_PY_FRAMES_311 2 /* tstate->cframe->current_frame: _PyInterpreterFrame chain */
#define GS_PY_FRAMES_313 3 /* tstate->current_frame: _PyInterpreterFrame chain */
struct gs_py_layout {
	__u64 runtime;           /* address of _PyRuntime in the process */
	__u32 kind;              /* GS_PY_FRAMES_* */
	__u32 runtime_interp_head; /* offsetof(_PyRuntimeState, interpreters.head) */
	__u32 interp_threads_head;
	__u32 tstate_next;
	__u32 tstate_thread_id;  /* pthread_self() of the thread: its fs base on x86-64 */
	__u32 tstate_frame;      /* frame, cframe or current_frame */
	__u32 cframe_current;    /* 3.11/3.12: offsetof(_PyCFrame, current_frame) */
	__u32 frame_previous;
	__u32 frame_code;
	__u32 frame_instr;
	__u32 frame_owner;       /* 0: no owner field (3.10) */
	__u32 instr_size;        /* bytes of the instruction field: 4 (f_lasti) or 8 (user space) */
};

/* One completed NCCL call: a gs_call plus the stack words at entry. */
struct gs_nccl {
	__u32 type; /* GS_REC_NCCL */
	__u32 op;
	__u32 pid;
	__u32 tid;
	__u64 start_ns;
	__u64 end_ns;
	__u64 args[GS_NARGS];
	__u64 stack[GS_NCCL_STACK_WORDS]; /* [rsp+8, rsp+8+32) at entry */
	__u64 out;
	__s64 ret;
	__u64 runnable_ns;
	__u64 blocked_ns;
	__u32 flags;
	__u32 cpu;
};

/* Process lifecycle events (gs_proc.event). */
#define GS_PROC_FORK 1
#define GS_PROC_EXEC 2
#define GS_PROC_EXIT 3
#define GS_PROC_OOM_VICTIM 4

struct gs_proc {
	__u32 type; /* GS_REC_PROC */
	__u32 event;
	__u32 pid;       /* process (tgid) */
	__u32 tid;
	__u32 ppid;      /* parent tgid for fork */
	__s32 exit_code; /* wait status for exit: (code << 8) | signal */
	__u64 ts_ns;
	char comm[GS_COMM_LEN];
};

/* Per-(process, op) counters for hot paths counted in the kernel. */
struct gs_count_key {
	__u32 pid;
	__u32 op;
};

/* Indices of the `stats` per-CPU array: every loss is counted here. */
#define GS_STAT_RING_DROP_CALL 0
#define GS_STAT_RING_DROP_WAIT 1
#define GS_STAT_RING_DROP_PROC 2
#define GS_STAT_INFLIGHT_FULL 3
#define GS_STAT_THREAD_FULL 4
#define GS_STAT_COUNT_FULL 5
#define GS_STAT_UNMATCHED_RETURN 6
#define GS_STAT_TRACED_FULL 7
#define GS_STAT_RING_DROP_BLOCK 8
#define GS_STAT_RING_DROP_NCCL 9
#define GS_STAT_RING_DROP_STACK 10 /* a call site lost: calls name a stack never stored */
#define GS_STAT_SWITCH_IN_UNSEEN 11 /* a traced thread ran without a sched_switch to it */
#define GS_STAT_MAX 12

/* Sizes pinned by crates/sleuth-core/src/record.rs: change both together. */
_Static_assert(sizeof(struct gs_call) == 128, "gs_call layout");
_Static_assert(sizeof(struct gs_culprit) == 32, "gs_culprit layout");
_Static_assert(sizeof(struct gs_wait) == 216, "gs_wait layout");
_Static_assert(sizeof(struct gs_proc) == 48, "gs_proc layout");
_Static_assert(sizeof(struct gs_block) == 184, "gs_block layout");
_Static_assert(sizeof(struct gs_nccl) == 152, "gs_nccl layout");
_Static_assert(sizeof(struct gs_stack) == 1312, "gs_stack layout");
_Static_assert(sizeof(struct gs_py_layout) == 56, "gs_py_layout layout");

#endif
_Static_assert(sizeof(struct gs_count_key) == 8, "gs_count_key layout");
