// SPDX-License-Identifier: GPL-2.0
/*
 * gpusleuth's kernel side: CUDA call probes (uprobes/uretprobes with an attach
 * cookie naming the op), in-kernel launch counters, and the scheduler context
 * of traced threads (tp_btf: sched_switch, sched_wakeup, process lifecycle).
 *
 * Only traced processes reach user space: a tgid is traced when user space
 * puts it in `traced`, when its parent is traced at fork, or (trace_all) when
 * it calls a probed CUDA function. Other tasks appear only as culprits: the
 * tasks that held the CPU while a traced thread waited for it.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "gpusleuth.h"

char LICENSE[] SEC("license") = "GPL";

/* Set by user space before load. */
const volatile __u32 trace_all = 0;    /* trace every process that calls CUDA */
const volatile __u32 self_tgid = 0;    /* never trace gpusleuth itself */
const volatile __u32 stacks_on = 0;    /* capture call sites (see "call sites" below) */
const volatile __u64 slow_stack_ns = 0; /* also capture the site of calls at least this long (0: off) */
/* offsetof(struct task_struct, thread.fsbase), found by user space in the
 * kernel's BTF: the call programs are also loaded without CO-RE (multi.rs). */
const volatile __u32 task_fsbase_off = 0;
/* Test seam (debug builds only, GPUSLEUTH_TEST_UNSEEN_SWITCH_IN): act as the
 * kernel did when it ran our programs for neither event (see
 * settle_unseen_switch_in): 1 = ignore every switch-in that ends a sleep,
 * 2 = also ignore the wakeups of sleeping threads. 0 in every real trace. */
const volatile __u32 test_unseen_switch_in = 0;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 << 20);
} events SEC(".maps");

/* tgid -> 1 while traced. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, __u8);
} traced SEC(".maps");

struct thread_state {
	__u64 off_ns;         /* switched out at */
	__u64 wake_ns;        /* woken at (== off_ns when preempted) */
	__u64 runnable_total; /* cumulative runnable-waiting time */
	__u64 blocked_total;  /* cumulative blocked time */
	__u32 state;          /* THREAD_ON_CPU, THREAD_RUNNABLE, THREAD_BLOCKED */
	__u32 prev_state;     /* raw state at switch-out */
	__u32 rt_depth;       /* runtime-layer calls in flight on this thread */
	__u32 waker_flags;    /* GS_WAKER_* of the current blocked interval */
	__u32 waker_pid;
	__u32 waker_tid;
	char waker_comm[GS_COMM_LEN];
	__u64 ran_at_off; /* its CPU time (se.sum_exec_runtime) at switch-out */
};
#define THREAD_ON_CPU 0
#define THREAD_RUNNABLE 1
#define THREAD_BLOCKED 2

/* tid -> scheduler accounting of a traced thread; removed at thread exit. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct thread_state);
} threads SEC(".maps");

struct inflight_call {
	__u64 start_ns;
	__u64 args[GS_NARGS];
	__u64 runnable_snap;
	__u64 blocked_snap;
	__u32 flags;
	__u32 pad;
};

/* (tid << 16 | op) -> call in flight. LRU: a thread killed mid-call cannot leak. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct inflight_call);
} inflight SEC(".maps");

/* (tid << 16 | op) -> Block words read at entry (caching-allocator free/release). */
struct block_words {
	__u64 w[GS_BLOCK_WORDS];
};
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct block_words);
} block_inflight SEC(".maps");

/* (tid << 16 | op) -> the caller's stack words at entry of an NCCL call. */
struct nccl_stack {
	__u64 w[GS_NCCL_STACK_WORDS];
};
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct nccl_stack);
} nccl_inflight SEC(".maps");

/* (tgid, op) -> calls, for hot paths counted in the kernel. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct gs_count_key);
	__type(value, __u64);
} op_counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, GS_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

struct cpu_slot {
	__u64 ts; /* when this task got the CPU */
	__u32 pid;
	__u32 tid;
	char comm[GS_COMM_LEN];
};

struct cpu_history {
	__u32 head; /* next slot to write */
	__u32 pad;
	struct cpu_slot slot[GS_CPU_HISTORY];
};

/* Per CPU: the last tasks that ran, to name who held a CPU a traced thread waited for. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cpu_history);
} cpu_hist SEC(".maps");

static __always_inline void count_stat(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &idx);
	if (v)
		*v += 1; /* per-CPU slot: no atomic needed */
}

/*
 * A counter of process `tgid`'s records (a loss, an edge): counted unless it
 * is gpusleuth's own, traced for a moment while it measures what a recorded
 * call's probes cost (its records are dropped in user space; their losses
 * are no trace's).
 */
static __always_inline void count_for(__u32 idx, __u32 tgid)
{
	if (tgid != self_tgid)
		count_stat(idx);
}

/*
 * Wake the user-space consumer only when the ring is filling up: it polls
 * every 50 ms anyway, and a wakeup per record would make the tracer preempt
 * the very threads whose waits it records (each wakeup a new wait: a loop).
 */
static __always_inline __u64 submit_flags(void)
{
	__u64 avail = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);
	__u64 size = bpf_ringbuf_query(&events, BPF_RB_RING_SIZE);
	return avail > size / 4 ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
}

static __always_inline int is_traced(__u32 tgid)
{
	return bpf_map_lookup_elem(&traced, &tgid) != NULL;
}

/* Decide whether the calling process is traced; in trace_all mode, start tracing it. */
static __always_inline int caller_traced(__u32 tgid)
{
	if (is_traced(tgid))
		return 1;
	if (!trace_all || tgid == self_tgid)
		return 0;
	__u8 one = 1;
	if (bpf_map_update_elem(&traced, &tgid, &one, BPF_NOEXIST) && !is_traced(tgid)) {
		count_stat(GS_STAT_TRACED_FULL);
		return 0;
	}
	return 1;
}

static __always_inline struct thread_state *thread_get_or_create(__u32 tid)
{
	struct thread_state *ts = bpf_map_lookup_elem(&threads, &tid);
	if (ts)
		return ts;
	struct thread_state zero = {};
	if (bpf_map_update_elem(&threads, &tid, &zero, BPF_NOEXIST) &&
	    !bpf_map_lookup_elem(&threads, &tid)) {
		count_stat(GS_STAT_THREAD_FULL);
		return NULL;
	}
	return bpf_map_lookup_elem(&threads, &tid);
}

/*
 * Ends a traced thread's off-CPU interval [off, on): adds its blocked part
 * (to the wakeup; to `on` when no wakeup was seen: all of it counts as
 * blocked) and its runnable part (from the wakeup to `on`) to the thread's
 * totals, and reserves its wait record, culprits left to the caller, which
 * submits it. NULL when the ring is full (counted). `*wake_out`: the wakeup
 * used.
 */
static __always_inline struct gs_wait *close_interval(struct thread_state *ts, __u32 pid, __u32 tid,
						      __u64 on, __u64 *wake_out)
{
	__u64 wake = ts->state == THREAD_BLOCKED ? on : ts->wake_ns;
	if (wake > on)
		wake = on;
	*wake_out = wake;
	ts->blocked_total += wake - ts->off_ns;
	ts->runnable_total += on - wake;
	struct gs_wait *w = bpf_ringbuf_reserve(&events, sizeof(*w), 0);
	if (!w) {
		count_for(GS_STAT_RING_DROP_WAIT, pid);
		return NULL;
	}
	__builtin_memset(w, 0, sizeof(*w));
	w->type = GS_REC_WAIT;
	w->kind = ts->wake_ns == ts->off_ns && ts->state == THREAD_RUNNABLE ? GS_WAIT_PREEMPTED
									     : GS_WAIT_BLOCKED;
	w->pid = pid;
	w->tid = tid;
	w->off_ns = ts->off_ns;
	w->wake_ns = wake;
	w->on_ns = on;
	w->prev_state = ts->prev_state;
	w->cpu = bpf_get_smp_processor_id();
	if (ts->waker_flags & GS_WAKER_KNOWN) {
		w->waker_pid = ts->waker_pid;
		w->waker_tid = ts->waker_tid;
		w->waker_flags = ts->waker_flags;
		__builtin_memcpy(w->waker_comm, ts->waker_comm, GS_COMM_LEN);
	}
	return w;
}

/*
 * A traced thread seen running (in a probe, or being switched out) while its
 * state says it is off the CPU: the kernel ran it without our sched_switch
 * program seeing the switch to it. Seen on the 6.18 Firecracker guests (the
 * development VM and the H200 machine) when the thread was woken in a hard
 * interrupt over the VM's agent: ftrace showed the wakeup and no switch, and
 * our sched_wakeup program did not run either (no recursion miss counted).
 * Without this the next switch-out overwrote the interval and a whole sleep
 * vanished from the call it happened in.
 *
 * `current` is the thread (probes and the switch-out run in its context), so
 * the CPU time it has had since its switch-out dates the unseen switch-in:
 * now minus that (the scheduler's count lags by at most a tick in a probe).
 * Blocked runs up to the wakeup where one was seen; where none was, up to
 * the switch-in (the switch-in handler's rule for a wakeup it never saw);
 * runnable from the wakeup to the switch-in. Counted in
 * GS_STAT_SWITCH_IN_UNSEEN; the wait record carries no culprits.
 */
static __always_inline void settle_unseen_switch_in(struct thread_state *ts, __u32 pid, __u32 tid)
{
	if (ts->state == THREAD_ON_CPU || ts->off_ns == 0)
		return;
	count_for(GS_STAT_SWITCH_IN_UNSEEN, pid);
	__u64 now = bpf_ktime_get_ns();
	struct task_struct *task = bpf_get_current_task_btf();
	__u64 ran = task->se.sum_exec_runtime - ts->ran_at_off;
	__u64 on = now > ran ? now - ran : 0;
	if (on > ts->off_ns) {
		__u64 wake;
		struct gs_wait *w = close_interval(ts, pid, tid, on, &wake);
		if (w)
			bpf_ringbuf_submit(w, submit_flags());
	}
	ts->state = THREAD_ON_CPU;
}

/* ---------------------------------------------------------------- call sites */

/* tgid -> how to walk its CPython frames; set by user space, removed at exec/exit. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, struct gs_py_layout);
} py_procs SEC(".maps");

/* tid -> its PyThreadState (checked on every use; LRU: no leak on exit). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u64);
} py_tstates SEC(".maps");

/* Stack ids already sent to user space. LRU: an evicted id is sent again,
 * which user space ignores; nothing is lost. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, __u8);
} stacks_seen SEC(".maps");

/* Per-CPU scratch for building one stack (too big for the BPF stack). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gs_stack);
} stack_scratch SEC(".maps");

static __always_inline __u64 read_u64(__u64 addr)
{
	__u64 v = 0;
	if (bpf_probe_read_user(&v, sizeof(v), (void *)addr))
		return 0;
	return v;
}

/*
 * The calling thread's PyThreadState: the entry of the main interpreter's
 * thread list whose thread_id (pthread_self(), which is the thread's fs base
 * on x86-64 glibc) is this thread's. The GIL holder is not the caller: ctypes
 * and PyTorch release the GIL around CUDA calls.
 */
static __always_inline __u64 py_tstate(struct gs_py_layout *l, __u32 tid)
{
	__u64 fsbase = 0;
	if (!task_fsbase_off)
		return 0;
	bpf_probe_read_kernel(&fsbase, sizeof(fsbase), (void *)(bpf_get_current_task() + task_fsbase_off));
	if (!fsbase)
		return 0;
	__u64 *cached = bpf_map_lookup_elem(&py_tstates, &tid);
	if (cached && *cached && read_u64(*cached + l->tstate_thread_id) == fsbase)
		return *cached;
	__u64 interp = read_u64(l->runtime + l->runtime_interp_head);
	if (!interp)
		return 0;
	__u64 ts = read_u64(interp + l->interp_threads_head);
	for (int i = 0; i < GS_PY_MAX_THREADS && ts; i++) {
		if (read_u64(ts + l->tstate_thread_id) == fsbase) {
			bpf_map_update_elem(&py_tstates, &tid, &ts, BPF_ANY);
			return ts;
		}
		ts = read_u64(ts + l->tstate_next);
	}
	return 0;
}

/* Fills s->py with the thread's Python frames, innermost first. */
static __always_inline void py_frames(struct gs_stack *s, struct gs_py_layout *l, __u32 tid)
{
	s->flags |= GS_STACK_PY;
	__u64 ts = py_tstate(l, tid);
	if (!ts) {
		s->flags |= GS_STACK_PY_NO_THREAD;
		return;
	}
	__u64 frame = read_u64(ts + l->tstate_frame);
	if (l->kind == GS_PY_FRAMES_311 && frame)
		frame = read_u64(frame + l->cframe_current);
	/* One frame per slot, innermost first; a shim frame owned by the C
	 * stack (3.12+: FRAME_OWNED_BY_CSTACK) keeps its slot with code 0 and
	 * user space skips it. One counter keeps the verifier's work linear. */
	int i = 0;
	for (; i < GS_PY_DEPTH && frame; i++) {
		__u8 owner = 0;
		if (l->frame_owner)
			bpf_probe_read_user(&owner, 1, (void *)(frame + l->frame_owner));
		__u64 code = read_u64(frame + l->frame_code);
		s->py[i].code = owner == 3 ? 0 : code;
		s->py[i].instr = read_u64(frame + l->frame_instr);
		frame = read_u64(frame + l->frame_previous);
	}
	if (frame)
		s->flags |= GS_STACK_PY_TRUNC;
	s->n_py = i;
}

static __always_inline __u64 mix(__u64 h, __u64 v)
{
	h ^= v;
	h *= 0x100000001b3ULL; /* FNV-1a prime, over words */
	return h ^ (h >> 29);
}

/*
 * Captures the calling thread's site: native frames (frame pointers), then
 * Python frames when the process runs a known CPython. Sends the stack once
 * per distinct id; returns the id (0 when nothing could be captured).
 * In a uretprobe the first native frame is the return address in the caller.
 * Inlined: multi.rs loads the call programs without bpf-to-bpf calls.
 */
static __always_inline __u64 capture_stack(void *ctx, __u32 tgid, __u32 tid)
{
	__u32 zero = 0;
	struct gs_stack *s = bpf_map_lookup_elem(&stack_scratch, &zero);
	if (!s)
		return 0;
	s->type = GS_REC_STACK;
	s->pid = tgid;
	s->flags = 0;
	s->n_py = 0;
	s->pad = 0;
	long got = bpf_get_stack(ctx, s->native, sizeof(s->native), BPF_F_USER_STACK);
	if (got < 0) {
		s->flags |= GS_STACK_NATIVE_ERR;
		got = 0;
	}
	s->n_native = (__u32)got / 8;
	if (s->n_native >= GS_NATIVE_DEPTH)
		s->flags |= GS_STACK_NATIVE_FULL;
	struct gs_py_layout *l = bpf_map_lookup_elem(&py_procs, &tgid);
	if (l)
		py_frames(s, l, tid);

	__u64 h = 0xcbf29ce484222325ULL ^ tgid;
	for (int i = 0; i < GS_NATIVE_DEPTH; i++) {
		if (i >= s->n_native)
			break;
		h = mix(h, s->native[i]);
	}
	h = mix(h, 0x5079 /* "Py" */);
	for (int i = 0; i < GS_PY_DEPTH; i++) {
		if (i >= s->n_py)
			break;
		h = mix(h, s->py[i].code);
		h = mix(h, s->py[i].instr);
	}
	h = mix(h, s->flags);
	if (h == 0)
		h = 1;
	s->id = h;
	if (bpf_map_lookup_elem(&stacks_seen, &h))
		return h;
	/* bpf_ringbuf_output copies from the scratch map: a stack is larger
	 * than the 1 KiB clang will expand __builtin_memcpy for. */
	if (bpf_ringbuf_output(&events, s, sizeof(*s), submit_flags())) {
		count_stat(GS_STAT_RING_DROP_STACK);
		return h;
	}
	__u8 one = 1;
	bpf_map_update_elem(&stacks_seen, &h, &one, BPF_ANY);
	return h;
}

/* ---------------------------------------------------------------- CUDA calls */

SEC("uprobe")
int BPF_KPROBE(call_entry)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	if (!caller_traced(tgid))
		return 0;
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u32 op = GS_COOKIE_OP(cookie);

	struct thread_state *ts = thread_get_or_create(tid);
	struct inflight_call c = {};
	c.start_ns = bpf_ktime_get_ns();
	c.args[0] = PT_REGS_PARM1(ctx);
	c.args[1] = PT_REGS_PARM2(ctx);
	c.args[2] = PT_REGS_PARM3(ctx);
	c.args[3] = PT_REGS_PARM4(ctx);
	c.args[4] = PT_REGS_PARM5(ctx);
	c.args[5] = ctx->r9 /* 6th argument; libbpf 1.1 has no PT_REGS_PARM6 */;
	if (ts) {
		settle_unseen_switch_in(ts, tgid, tid);
		c.runnable_snap = ts->runnable_total;
		c.blocked_snap = ts->blocked_total;
		if (cookie & GS_COOKIE_RUNTIME)
			ts->rt_depth += 1;
		else if (ts->rt_depth > 0)
			c.flags |= GS_CALL_NESTED;
	}
	__u64 key = ((__u64)tid << 16) | op;
	if (bpf_map_update_elem(&inflight, &key, &c, BPF_ANY))
		count_for(GS_STAT_INFLIGHT_FULL, tgid);
	if (cookie & GS_COOKIE_BLOCK_ARG1) {
		struct block_words bw = {};
		if (c.args[1])
			bpf_probe_read_user(&bw, sizeof(bw), (void *)c.args[1]);
		if (bpf_map_update_elem(&block_inflight, &key, &bw, BPF_ANY))
			count_stat(GS_STAT_INFLIGHT_FULL);
	}
	if (cookie & GS_COOKIE_NCCL) {
		struct nccl_stack st = {};
		/* At entry rsp points at the return address; arguments follow it. */
		bpf_probe_read_user(&st, sizeof(st), (void *)(PT_REGS_SP(ctx) + 8));
		if (bpf_map_update_elem(&nccl_inflight, &key, &st, BPF_ANY))
			count_stat(GS_STAT_INFLIGHT_FULL);
	}
	return 0;
}

/* Reads the value a call stored through its out-pointer argument (the attach
 * cookie names which argument, 1..6; 0: none). Returns GS_CALL_OUT_VALID when
 * it could be read; *out is 0 otherwise. One copy for call and NCCL records. */
static __always_inline __u32 read_out_arg(__u64 cookie, const struct inflight_call *c, __u64 *out)
{
	__u64 ptr = 0;
	switch (GS_COOKIE_OUT_ARG(cookie)) {
	case 1: ptr = c->args[0]; break;
	case 2: ptr = c->args[1]; break;
	case 3: ptr = c->args[2]; break;
	case 4: ptr = c->args[3]; break;
	case 5: ptr = c->args[4]; break;
	case 6: ptr = c->args[5]; break;
	default: break;
	}
	*out = 0;
	if (ptr && bpf_probe_read_user(out, sizeof(*out), (void *)ptr) == 0)
		return GS_CALL_OUT_VALID;
	return 0;
}

/* NCCL calls: one gs_nccl record, a gs_call with the stack words at entry. */
static __always_inline void emit_nccl(void *ctx, __u64 cookie, __u64 key, struct inflight_call *c,
				      __u32 tgid, __u32 tid, __u32 op, __u64 now)
{
	struct thread_state *ts = bpf_map_lookup_elem(&threads, &tid);
	if (ts)
		settle_unseen_switch_in(ts, tgid, tid);
	struct gs_nccl *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_stat(GS_STAT_RING_DROP_NCCL);
		bpf_map_delete_elem(&nccl_inflight, &key);
		return;
	}
	e->type = GS_REC_NCCL;
	e->op = op;
	e->pid = tgid;
	e->tid = tid;
	e->start_ns = c->start_ns;
	e->end_ns = now;
	__builtin_memcpy(e->args, c->args, sizeof(e->args));
	__builtin_memset(e->stack, 0, sizeof(e->stack));
	struct nccl_stack *st = bpf_map_lookup_elem(&nccl_inflight, &key);
	if (st) {
		__builtin_memcpy(e->stack, st->w, sizeof(e->stack));
		bpf_map_delete_elem(&nccl_inflight, &key);
	}
	e->ret = PT_REGS_RC((struct pt_regs *)ctx);
	e->flags = c->flags | read_out_arg(cookie, c, &e->out);
	e->runnable_ns = ts ? ts->runnable_total - c->runnable_snap : 0;
	e->blocked_ns = ts ? ts->blocked_total - c->blocked_snap : 0;
	e->cpu = bpf_get_smp_processor_id();
	bpf_ringbuf_submit(e, submit_flags());
}

/* Caching-allocator calls: one gs_block record with the Block's words. */
static __always_inline void emit_block(void *ctx, __u64 cookie, __u64 key, struct inflight_call *c,
				       __u32 tgid, __u32 tid, __u32 op, __u64 now, __u64 site)
{
	struct gs_block *b = bpf_ringbuf_reserve(&events, sizeof(*b), 0);
	if (!b) {
		count_stat(GS_STAT_RING_DROP_BLOCK);
		return;
	}
	b->type = GS_REC_BLOCK;
	b->op = op;
	b->pid = tgid;
	b->tid = tid;
	b->start_ns = c->start_ns;
	b->end_ns = now;
	b->requested = c->args[1];
	b->stack_id = site;
	__builtin_memset(b->words, 0, sizeof(b->words));
	if (cookie & GS_COOKIE_BLOCK_RET) {
		b->block = PT_REGS_RC((struct pt_regs *)ctx);
		if (b->block)
			bpf_probe_read_user(b->words, sizeof(b->words), (void *)b->block);
	} else {
		b->block = c->args[1];
		struct block_words *bw = bpf_map_lookup_elem(&block_inflight, &key);
		if (bw) {
			__builtin_memcpy(b->words, bw->w, sizeof(b->words));
			bpf_map_delete_elem(&block_inflight, &key);
		}
	}
	bpf_ringbuf_submit(b, submit_flags());
}

SEC("uretprobe")
int BPF_KRETPROBE(call_return)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u32 op = GS_COOKIE_OP(cookie);
	__u64 key = ((__u64)tid << 16) | op;
	struct inflight_call *c = bpf_map_lookup_elem(&inflight, &key);
	if (!c) {
		/* Entry not seen: untraced caller, or attached while the call ran. */
		if (is_traced(tgid))
			count_stat(GS_STAT_UNMATCHED_RETURN);
		return 0;
	}
	__u64 now = bpf_ktime_get_ns();
	/* The site is captured before the record is reserved: a stack record
	 * sent now reaches user space before the call that names it. Nested
	 * driver calls share their runtime caller's site unless they failed;
	 * allocator blocks (no error code) only when their op asks for it. */
	__u64 site = 0;
	int block = (cookie & (GS_COOKIE_BLOCK_RET | GS_COOKIE_BLOCK_ARG1)) != 0;
	__s32 rc = block ? 0 : (__s32)PT_REGS_RC(ctx);
	/* NCCL records carry no site: none is taken for them. */
	if (stacks_on && !(cookie & GS_COOKIE_NCCL) && (rc != 0 || (!(c->flags & GS_CALL_NESTED) &&
				      ((cookie & GS_COOKIE_STACK) ||
				       (!block && slow_stack_ns && now - c->start_ns >= slow_stack_ns)))))
		site = capture_stack(ctx, tgid, tid);
	if (block) {
		emit_block(ctx, cookie, key, c, tgid, tid, op, now, site);
		bpf_map_delete_elem(&inflight, &key);
		return 0;
	}
	if (cookie & GS_COOKIE_NCCL) {
		emit_nccl(ctx, cookie, key, c, tgid, tid, op, now);
		bpf_map_delete_elem(&inflight, &key);
		return 0;
	}
	struct thread_state *ts = bpf_map_lookup_elem(&threads, &tid);
	if (ts)
		settle_unseen_switch_in(ts, tgid, tid);

	struct gs_call *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_for(GS_STAT_RING_DROP_CALL, tgid);
	} else {
		e->type = GS_REC_CALL;
		e->op = op;
		e->pid = tgid;
		e->tid = tid;
		e->start_ns = c->start_ns;
		e->end_ns = now;
		__builtin_memcpy(e->args, c->args, sizeof(e->args));
		e->ret = PT_REGS_RC(ctx);
		e->flags = c->flags | read_out_arg(cookie, c, &e->out);
		e->runnable_ns = ts ? ts->runnable_total - c->runnable_snap : 0;
		e->blocked_ns = ts ? ts->blocked_total - c->blocked_snap : 0;
		e->cpu = bpf_get_smp_processor_id();
		e->stack_id = site;
		bpf_ringbuf_submit(e, submit_flags());
	}
	if (ts && (cookie & GS_COOKIE_RUNTIME) && ts->rt_depth > 0)
		ts->rt_depth -= 1;
	bpf_map_delete_elem(&inflight, &key);
	return 0;
}

/* Hot paths (kernel launches): one trap, one counter increment, no record. */
SEC("uprobe")
int BPF_KPROBE(call_count)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!caller_traced(tgid))
		return 0;
	struct gs_count_key k = { .pid = tgid, .op = GS_COOKIE_OP(bpf_get_attach_cookie(ctx)) };
	__u64 *v = bpf_map_lookup_elem(&op_counts, &k);
	if (v) {
		__sync_fetch_and_add(v, 1);
		return 0;
	}
	__u64 one = 1;
	if (bpf_map_update_elem(&op_counts, &k, &one, BPF_NOEXIST)) {
		v = bpf_map_lookup_elem(&op_counts, &k);
		if (v)
			__sync_fetch_and_add(v, 1);
		else
			count_stat(GS_STAT_COUNT_FULL);
	}
	return 0;
}

/* ----------------------------------------------------------------- scheduler */

static __always_inline void add_culprit(struct gs_wait *w, struct cpu_slot *s, __u64 ns)
{
#pragma unroll
	for (int j = 0; j < GS_MAX_CULPRITS; j++) {
		if (j < w->n_culprits) {
			if (w->culprits[j].tid == s->tid) {
				w->culprits[j].ns += ns;
				return;
			}
		} else {
			w->culprits[j].pid = s->pid;
			w->culprits[j].tid = s->tid;
			w->culprits[j].ns = ns;
			__builtin_memcpy(w->culprits[j].comm, s->comm, GS_COMM_LEN);
			w->n_culprits = j + 1;
			return;
		}
	}
	/* More than GS_MAX_CULPRITS holders: the rest stays unattributed. */
}

/*
 * Name the tasks that held this CPU during [wake, now): walk the CPU's recent
 * history backwards. Time on other CPUs (a migrated thread) stays unattributed.
 */
static __always_inline void attribute_wait(struct gs_wait *w, struct cpu_history *h, __u64 wake,
					   __u64 now, __u32 self_tid)
{
	__u64 end = now;
#pragma unroll
	for (int i = 1; i <= GS_CPU_HISTORY; i++) {
		struct cpu_slot *s = &h->slot[(h->head - i) & (GS_CPU_HISTORY - 1)];
		if (s->ts == 0 || end <= wake)
			break;
		__u64 start = s->ts > wake ? s->ts : wake;
		if (end > start && s->tid != self_tid && s->tid != 0)
			add_culprit(w, s, end - start);
		if (s->ts <= wake)
			break;
		end = s->ts;
	}
}

SEC("tp_btf/sched_switch")
int BPF_PROG(on_sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	__u64 now = bpf_ktime_get_ns();
	__u32 prev_tid = prev->pid, prev_tgid = prev->tgid;
	__u32 next_tid = next->pid, next_tgid = next->tgid;

	if (prev_tid != 0 && is_traced(prev_tgid)) {
		struct thread_state *ts = thread_get_or_create(prev_tid);
		if (ts) {
			settle_unseen_switch_in(ts, prev_tgid, prev_tid);
			ts->off_ns = now;
			ts->ran_at_off = prev->se.sum_exec_runtime;
			ts->wake_ns = now;
			ts->prev_state = prev_state;
			ts->state = (preempt || prev_state == 0) ? THREAD_RUNNABLE : THREAD_BLOCKED;
			ts->waker_flags = 0;
		}
	}

	__u32 zero = 0;
	struct cpu_history *h = bpf_map_lookup_elem(&cpu_hist, &zero);

	if (next_tid != 0 && is_traced(next_tgid)) {
		struct thread_state *ts = bpf_map_lookup_elem(&threads, &next_tid);
		if (ts && test_unseen_switch_in && ts->state != THREAD_ON_CPU &&
		    (ts->state == THREAD_BLOCKED || ts->wake_ns != ts->off_ns))
			ts = NULL; /* test seam: this switch-in goes unseen */
		if (ts && ts->state != THREAD_ON_CPU && ts->off_ns != 0) {
			__u64 wake;
			struct gs_wait *w = close_interval(ts, next_tgid, next_tid, now, &wake);
			if (w) {
				if (h && now > wake)
					attribute_wait(w, h, wake, now, next_tid);
				bpf_ringbuf_submit(w, submit_flags());
			}
		}
		if (ts)
			ts->state = THREAD_ON_CPU;
	}

	if (h) {
		struct cpu_slot *s = &h->slot[h->head & (GS_CPU_HISTORY - 1)];
		s->ts = now;
		s->pid = next_tgid;
		s->tid = next_tid;
		bpf_probe_read_kernel(s->comm, GS_COMM_LEN, next->comm);
		h->head += 1;
	}
	return 0;
}

static __always_inline void on_wakeup(struct task_struct *p)
{
	__u32 tid = p->pid;
	if (!is_traced(p->tgid))
		return;
	if (test_unseen_switch_in >= 2)
		return; /* test seam: the wakeup goes unseen too */
	struct thread_state *ts = bpf_map_lookup_elem(&threads, &tid);
	if (ts && ts->state == THREAD_BLOCKED) {
		ts->wake_ns = bpf_ktime_get_ns();
		ts->state = THREAD_RUNNABLE;
	}
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(on_sched_wakeup, struct task_struct *p)
{
	on_wakeup(p);
	return 0;
}

/* Per CPU: interrupt handlers (hard, soft, hrtimer) running now. A wakeup
 * made inside one is not the doing of the task it interrupted. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} irq_depth SEC(".maps");

static __always_inline void irq_enter_exit(int enter)
{
	__u32 zero = 0;
	__u32 *d = bpf_map_lookup_elem(&irq_depth, &zero);
	if (!d)
		return;
	if (enter)
		*d += 1;
	else if (*d > 0)
		*d -= 1; /* attached mid-handler: the entry was not seen */
}

SEC("tp_btf/irq_handler_entry")
int BPF_PROG(on_irq_entry) { irq_enter_exit(1); return 0; }
SEC("tp_btf/irq_handler_exit")
int BPF_PROG(on_irq_exit) { irq_enter_exit(0); return 0; }
SEC("tp_btf/softirq_entry")
int BPF_PROG(on_softirq_entry) { irq_enter_exit(1); return 0; }
SEC("tp_btf/softirq_exit")
int BPF_PROG(on_softirq_exit) { irq_enter_exit(0); return 0; }
SEC("tp_btf/hrtimer_expire_entry")
int BPF_PROG(on_hrtimer_entry) { irq_enter_exit(1); return 0; }
SEC("tp_btf/hrtimer_expire_exit")
int BPF_PROG(on_hrtimer_exit) { irq_enter_exit(0); return 0; }

/*
 * sched_waking runs in the waker's context (sched_wakeup may run later on the
 * wakee's CPU): remember who woke a sleeping traced thread. The switch-in
 * handler copies it into the wait record.
 */
SEC("tp_btf/sched_waking")
int BPF_PROG(on_sched_waking, struct task_struct *p)
{
	__u32 tid = p->pid;
	if (!is_traced(p->tgid))
		return 0;
	struct thread_state *ts = bpf_map_lookup_elem(&threads, &tid);
	if (!ts || ts->state != THREAD_BLOCKED || (ts->waker_flags & GS_WAKER_KNOWN))
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	__u32 zero = 0;
	__u32 *d = bpf_map_lookup_elem(&irq_depth, &zero);
	ts->waker_pid = id >> 32;
	ts->waker_tid = (__u32)id;
	bpf_get_current_comm(ts->waker_comm, GS_COMM_LEN);
	ts->waker_flags = GS_WAKER_KNOWN | ((d && *d > 0) ? GS_WAKER_IRQ : 0);
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(on_sched_wakeup_new, struct task_struct *p)
{
	on_wakeup(p);
	return 0;
}

/* ----------------------------------------------------------------- lifecycle */

static __always_inline void emit_proc(__u32 event, __u32 pid, __u32 tid, __u32 ppid, __s32 code,
				      struct task_struct *t)
{
	struct gs_proc *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_stat(GS_STAT_RING_DROP_PROC);
		return;
	}
	e->type = GS_REC_PROC;
	e->event = event;
	e->pid = pid;
	e->tid = tid;
	e->ppid = ppid;
	e->exit_code = code;
	e->ts_ns = bpf_ktime_get_ns();
	bpf_probe_read_kernel(e->comm, GS_COMM_LEN, t->comm);
	bpf_ringbuf_submit(e, submit_flags());
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(on_fork, struct task_struct *parent, struct task_struct *child)
{
	__u32 ptgid = parent->tgid, ctgid = child->tgid;
	if (ptgid == ctgid || !is_traced(ptgid))
		return 0; /* a new thread, or an untraced parent */
	__u8 one = 1;
	if (bpf_map_update_elem(&traced, &ctgid, &one, BPF_ANY)) {
		count_stat(GS_STAT_TRACED_FULL);
		return 0;
	}
	emit_proc(GS_PROC_FORK, ctgid, child->pid, ptgid, 0, child);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(on_exec, struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)
{
	if (!is_traced(p->tgid))
		return 0;
	__u32 tgid = p->tgid;
	bpf_map_delete_elem(&py_procs, &tgid); /* a new program: user space looks again */
	emit_proc(GS_PROC_EXEC, p->tgid, p->pid, 0, 0, p);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *p, bool group_dead)
{
	__u32 tid = p->pid, tgid = p->tgid;
	if (!is_traced(tgid))
		return 0;
	bpf_map_delete_elem(&threads, &tid);
	bpf_map_delete_elem(&py_tstates, &tid);
	if (group_dead) {
		bpf_map_delete_elem(&py_procs, &tgid);
		emit_proc(GS_PROC_EXIT, tgid, tid, 0, p->exit_code, p);
		bpf_map_delete_elem(&traced, &tgid);
	}
	return 0;
}

SEC("tp_btf/mark_victim")
int BPF_PROG(on_oom_victim, struct task_struct *p, uid_t uid)
{
	if (!is_traced(p->tgid))
		return 0;
	emit_proc(GS_PROC_OOM_VICTIM, p->tgid, p->pid, 0, 0, p);
	return 0;
}

/* Sizes pinned by crates/sleuth-core/src/record.rs (ThreadState, InflightCall). */
_Static_assert(sizeof(struct thread_state) == 80, "thread_state layout");
_Static_assert(sizeof(struct inflight_call) == 80, "inflight_call layout");
