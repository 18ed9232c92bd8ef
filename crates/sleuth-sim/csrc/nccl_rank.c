/*
 * nccl_rank RANK NRANKS ID_FILE ITERS WORK_MS [--input-ms MS] [--cpu CPU] [--log FILE]
 *
 * One rank of a simulated data-parallel job: rank 0 writes a unique id to
 * ID_FILE (atomically), the others read it; all init one communicator, then
 * ITERS times: sleep --input-ms (waiting for the next batch: the thread
 * blocks, like a data loader waiting on I/O), burn WORK_MS of thread CPU
 * time (the "step"), then
 * ncclAllReduce (1024 float32, sum, stream 0x5). A larger WORK_MS or
 * --input-ms makes this rank the straggler. With --log, every collective's entry and return
 * (CLOCK_MONOTONIC ns, the clock of bpf_ktime_get_ns) is written as
 * "allreduce SEQ ENTRY_NS RETURN_NS", plus "pid PID": the ground truth of
 * lateness. Finally ncclCommDestroy.
 */
#define _GNU_SOURCE
#include "nccl_sim.h"
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static unsigned long long clock_ns(clockid_t id)
{
	struct timespec ts;
	clock_gettime(id, &ts);
	return (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
}

static void burn_cpu_ms(unsigned long long ms)
{
	unsigned long long end = clock_ns(CLOCK_THREAD_CPUTIME_ID) + ms * 1000000ULL;
	volatile unsigned long long spins = 0;
	while (clock_ns(CLOCK_THREAD_CPUTIME_ID) < end)
		spins++;
}

static int get_id(int rank, const char *path, ncclUniqueId *id)
{
	if (rank == 0) {
		if (ncclGetUniqueId(id) != ncclSuccess)
			return -1;
		char tmp[4096];
		snprintf(tmp, sizeof(tmp), "%s.tmp", path);
		FILE *f = fopen(tmp, "wb");
		if (!f || fwrite(id, sizeof(*id), 1, f) != 1 || fclose(f) != 0)
			return -1;
		return rename(tmp, path);
	}
	for (int i = 0; i < 60000; i++) {
		FILE *f = fopen(path, "rb");
		if (f) {
			size_t n = fread(id, sizeof(*id), 1, f);
			fclose(f);
			if (n == 1)
				return 0;
		}
		usleep(1000);
	}
	return -1;
}

int main(int argc, char **argv)
{
	if (argc < 6) {
		fprintf(stderr, "usage: nccl_rank RANK NRANKS ID_FILE ITERS WORK_MS [--input-ms MS] "
				"[--cpu CPU] [--log FILE]\n");
		return 2;
	}
	int rank = atoi(argv[1]), nranks = atoi(argv[2]), iters = atoi(argv[4]);
	unsigned long long work_ms = strtoull(argv[5], NULL, 10);
	unsigned long long input_ms = 0;
	FILE *log = NULL;
	for (int i = 6; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--cpu")) {
			cpu_set_t set;
			CPU_ZERO(&set);
			CPU_SET(atoi(argv[i + 1]), &set);
			if (sched_setaffinity(0, sizeof(set), &set) != 0) {
				perror("nccl_rank: sched_setaffinity");
				return 1;
			}
		} else if (!strcmp(argv[i], "--input-ms")) {
			input_ms = strtoull(argv[i + 1], NULL, 10);
		} else if (!strcmp(argv[i], "--log")) {
			log = fopen(argv[i + 1], "w");
			if (!log) {
				perror("nccl_rank: log");
				return 1;
			}
		}
	}
	ncclUniqueId id;
	if (get_id(rank, argv[3], &id) != 0) {
		fprintf(stderr, "nccl_rank %d: no unique id\n", rank);
		return 1;
	}
	ncclComm_t comm;
	ncclResult_t r = ncclCommInitRank(&comm, nranks, id, rank);
	if (r != ncclSuccess) {
		fprintf(stderr, "nccl_rank %d: ncclCommInitRank: %d\n", rank, r);
		return 1;
	}
	if (log)
		fprintf(log, "pid %d\n", getpid());
	static float buf[1024];
	for (int k = 0; k < iters; k++) {
		if (input_ms) {
			struct timespec d = { (time_t)(input_ms / 1000), (long)(input_ms % 1000) * 1000000L };
			while (nanosleep(&d, &d) != 0)
				;
		}
		burn_cpu_ms(work_ms);
		unsigned long long t0 = clock_ns(CLOCK_MONOTONIC);
		r = ncclAllReduce(buf, buf, 1024, ncclFloat32, ncclSum, comm, (cudaStream_t)0x5);
		unsigned long long t1 = clock_ns(CLOCK_MONOTONIC);
		if (r != ncclSuccess) {
			fprintf(stderr, "nccl_rank %d: ncclAllReduce: %d\n", rank, r);
			return 1;
		}
		if (log)
			fprintf(log, "allreduce %d %llu %llu\n", k, t0, t1);
	}
	ncclCommDestroy(comm);
	if (log)
		fclose(log);
	return 0;
}
