/*
 * gs-hog CPU MS [READY_FILE]: pins itself to CPU, names itself "gs-hog",
 * creates READY_FILE once it is running there, then busy-loops for MS
 * milliseconds of wall time (or until killed). The CPU-contention culprit of
 * the host-context tests.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

static unsigned long long now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: gs-hog CPU MS [READY_FILE]\n");
		return 2;
	}
	int cpu = atoi(argv[1]);
	unsigned long long ms = strtoull(argv[2], NULL, 10);
	prctl(PR_SET_NAME, "gs-hog", 0, 0, 0);
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set) != 0) {
		perror("gs-hog: sched_setaffinity");
		return 1;
	}
	if (argc > 3) {
		int fd = open(argv[3], O_CREAT | O_WRONLY, 0644);
		if (fd < 0) {
			perror("gs-hog: ready file");
			return 1;
		}
		close(fd);
	}
	unsigned long long end = now_ns() + ms * 1000000ULL;
	volatile unsigned long long spins = 0;
	while (now_ns() < end)
		spins++;
	return 0;
}
