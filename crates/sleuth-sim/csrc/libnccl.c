/*
 * libnccl.so.2 stand-in: NCCL 2.28's exported entry points with the real
 * signatures, for processes that play the ranks of one job on one machine.
 *
 * Rendezvous: ranks of a communicator share a page mapped from a file named
 * after the unique id (in $SIM_NCCL_DIR, default /tmp). Init and every
 * collective are a barrier on that page (a futex on a generation counter):
 * the call blocks, asleep, until the last rank arrives, as a real rank waits
 * for its peers. No data moves; counts, types and streams are only checked.
 * Send/recv and group calls return at once. ncclCommSplit gives a
 * communicator that shares its parent's barrier (every rank passes the
 * same color); ncclCommInitAll makes ranks of one process (no barrier).
 */
#define _GNU_SOURCE
#include "nccl_sim.h"
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default"), noinline))

struct shared {
	int arrived;
	int gen;
};

struct ncclComm {
	int rank;
	int nranks;
	struct shared *shm; /* NULL: ranks of one process, nothing to wait for */
};

static void barrier(struct ncclComm *c)
{
	struct shared *s = c->shm;
	if (!s || c->nranks <= 1)
		return;
	int gen = __atomic_load_n(&s->gen, __ATOMIC_ACQUIRE);
	if (__atomic_add_fetch(&s->arrived, 1, __ATOMIC_ACQ_REL) == c->nranks) {
		__atomic_store_n(&s->arrived, 0, __ATOMIC_RELEASE);
		__atomic_add_fetch(&s->gen, 1, __ATOMIC_ACQ_REL);
		syscall(SYS_futex, &s->gen, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
		return;
	}
	while (__atomic_load_n(&s->gen, __ATOMIC_ACQUIRE) == gen)
		syscall(SYS_futex, &s->gen, FUTEX_WAIT, gen, NULL, NULL, 0);
}

EXPORT ncclResult_t ncclGetVersion(int *version)
{
	if (!version)
		return ncclInvalidArgument;
	*version = 22809;
	return ncclSuccess;
}

EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
	if (!id)
		return ncclInvalidArgument;
	memset(id, 0, sizeof(*id));
	/* Like NCCL's bootstrap handle: a random magic first. */
	if (getrandom(id->internal, 16, 0) != 16)
		return ncclSystemError;
	return ncclSuccess;
}

static ncclResult_t init_rank(ncclComm_t *comm, int nranks, const ncclUniqueId *id, int rank)
{
	if (!comm || nranks < 1 || rank < 0 || rank >= nranks)
		return ncclInvalidArgument;
	const char *dir = getenv("SIM_NCCL_DIR");
	char path[4096];
	int n = snprintf(path, sizeof(path), "%s/nccl-", dir && *dir ? dir : "/tmp");
	for (int i = 0; i < 16 && n < (int)sizeof(path) - 3; i++)
		n += snprintf(path + n, sizeof(path) - n, "%02x", (unsigned char)id->internal[i]);
	int fd = open(path, O_RDWR | O_CREAT, 0600);
	if (fd < 0)
		return ncclSystemError;
	if (ftruncate(fd, 4096) != 0) {
		close(fd);
		return ncclSystemError;
	}
	void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return ncclSystemError;
	struct ncclComm *c = calloc(1, sizeof(*c));
	if (!c) {
		munmap(p, 4096);
		return ncclSystemError;
	}
	c->rank = rank;
	c->nranks = nranks;
	c->shm = p;
	barrier(c); /* init returns once every rank has joined */
	*comm = c;
	return ncclSuccess;
}

EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
	return init_rank(comm, nranks, &commId, rank);
}

EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId,
					   int rank, ncclConfig_t *config)
{
	(void)config;
	return init_rank(comm, nranks, &commId, rank);
}

EXPORT ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
	(void)devlist;
	if (!comms || ndev < 1)
		return ncclInvalidArgument;
	for (int i = 0; i < ndev; i++) {
		struct ncclComm *c = calloc(1, sizeof(*c));
		if (!c)
			return ncclSystemError;
		c->rank = i;
		c->nranks = ndev;
		comms[i] = c;
	}
	return ncclSuccess;
}

EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
				  ncclConfig_t *config)
{
	(void)color;
	(void)key;
	(void)config;
	if (!comm || !newcomm)
		return ncclInvalidArgument;
	barrier(comm);
	struct ncclComm *c = calloc(1, sizeof(*c));
	if (!c)
		return ncclSystemError;
	*c = *comm;
	*newcomm = c;
	return ncclSuccess;
}

static ncclResult_t end_comm(ncclComm_t comm)
{
	if (!comm)
		return ncclInvalidArgument;
	/* A split communicator shares its parent's page: the mapping stays. */
	free(comm);
	return ncclSuccess;
}

EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
	return end_comm(comm);
}

EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm)
{
	return end_comm(comm);
}

EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
	if (!comm || !count)
		return ncclInvalidArgument;
	*count = comm->nranks;
	return ncclSuccess;
}

EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
	if (!comm || !rank)
		return ncclInvalidArgument;
	*rank = comm->rank;
	return ncclSuccess;
}

static ncclResult_t collective(ncclComm_t comm, ncclDataType_t dt)
{
	if (!comm || (int)dt < 0 || dt > ncclBfloat16)
		return ncclInvalidArgument;
	barrier(comm);
	return ncclSuccess;
}

EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
				  ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
				  cudaStream_t stream)
{
	(void)sendbuff, (void)recvbuff, (void)count, (void)op, (void)stream;
	return collective(comm, datatype);
}

EXPORT ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
				  ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff, (void)recvbuff, (void)sendcount, (void)stream;
	return collective(comm, datatype);
}

EXPORT ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
				      ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
				      cudaStream_t stream)
{
	(void)sendbuff, (void)recvbuff, (void)recvcount, (void)op, (void)stream;
	return collective(comm, datatype);
}

EXPORT ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
				  ncclDataType_t datatype, int root, ncclComm_t comm,
				  cudaStream_t stream)
{
	(void)sendbuff, (void)recvbuff, (void)count, (void)stream;
	if (comm && (root < 0 || root >= comm->nranks))
		return ncclInvalidArgument;
	return collective(comm, datatype);
}

EXPORT ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
			       ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
			       cudaStream_t stream)
{
	(void)sendbuff, (void)recvbuff, (void)count, (void)op, (void)stream;
	if (comm && (root < 0 || root >= comm->nranks))
		return ncclInvalidArgument;
	return collective(comm, datatype);
}

EXPORT ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype,
			     int peer, ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff, (void)count, (void)datatype, (void)stream;
	return (comm && peer >= 0 && peer < comm->nranks) ? ncclSuccess : ncclInvalidArgument;
}

EXPORT ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
			     ncclComm_t comm, cudaStream_t stream)
{
	(void)recvbuff, (void)count, (void)datatype, (void)stream;
	return (comm && peer >= 0 && peer < comm->nranks) ? ncclSuccess : ncclInvalidArgument;
}

EXPORT ncclResult_t ncclGroupStart(void)
{
	return ncclSuccess;
}

EXPORT ncclResult_t ncclGroupEnd(void)
{
	return ncclSuccess;
}
