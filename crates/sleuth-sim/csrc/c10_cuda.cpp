/*
 * libc10_cuda.so stand-in: a small but honest CUDA caching allocator with the
 * entry points gpusleuth's `trace --torch-allocator` probes, under the exact
 * demangled names and signatures of torch 2.11:
 *
 *   c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(unsigned long, CUstream_st*)
 *   ...::DeviceCachingAllocator::free(c10::cuda::CUDACachingAllocator::Native::(anonymous namespace)::Block*)
 *   ...::DeviceCachingAllocator::release_block(...(anonymous namespace)::Block*, std::shared_ptr<c10::GatheredContext> const&)
 *   c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::emptyCache(std::pair<unsigned long long, unsigned long long>)
 *
 * It follows PyTorch's rules: requests are rounded up to 512 B; requests
 * <= 1 MiB come from the small pool's 2 MiB segments, larger ones from the
 * large pool's segments (20 MiB below 10 MiB, else rounded up to 2 MiB);
 * a found block is split when the remainder is >= 512 B (small pool) or
 * > 1 MiB (large pool); a freed block merges with free neighbours; emptyCache
 * releases (cudaFree) only segments that are entirely free. Segments come
 * from the simulated runtime's cudaMalloc/cudaFree.
 *
 * Compile-time variants (see build.rs):
 *   SIM_TORCH_ALT_LAYOUT      Block fields at other word offsets (requested at
 *                             word 9, size at 5, ptr at 3) to prove gpusleuth
 *                             calibrates the layout from the data.
 *   SIM_TORCH_MALLOC_NO_STREAM  malloc(unsigned long): a signature gpusleuth
 *                             must refuse to probe.
 *
 * Entry points for the workload (extern "C"): simTorchMalloc(size) -> Block
 * handle (NULL on failure or size 0), simTorchFree(handle), simTorchEmptyCache().
 * Member functions are noipa so they stay real functions with their own
 * symbols and unchanged argument registers (no inlining, cloning or IPA-SRA).
 */
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

extern "C" int cudaMalloc(void **ptr, size_t size);
extern "C" int cudaFree(void *ptr);

struct CUstream_st;

#define SIM_ENTRY __attribute__((noinline, noipa))

namespace c10 {
struct GatheredContext {
	int unused;
};

namespace cuda {
namespace CUDACachingAllocator {
namespace Native {
namespace {

constexpr size_t kMinBlockSize = 512;
constexpr size_t kSmallSize = 1 << 20;
constexpr size_t kSmallBuffer = 2 << 20;
constexpr size_t kLargeBuffer = 20 << 20;
constexpr size_t kMinLargeAlloc = 10 << 20;
constexpr size_t kRoundLarge = 2 << 20;

struct BlockPool;

/* Sixteen 8-byte words, like the part of torch's Block that gpusleuth reads. */
struct Block {
#ifndef SIM_TORCH_ALT_LAYOUT
	/* torch 2.11: device, stream, stream_uses, size, requested_size, pool, ptr, ... */
	signed char device;          /* word 0 (int8 + padding) */
	CUstream_st *stream;         /* word 1 */
	uintptr_t stream_uses[5];    /* words 2..6: an opaque set */
	size_t size;                 /* word 7 */
	size_t requested_size;       /* word 8 */
	BlockPool *pool;             /* word 9 */
	char *ptr;                   /* word 10 */
	bool allocated;              /* word 11 */
	Block *prev;                 /* word 12 */
	Block *next;                 /* word 13 */
	uint64_t event_count;        /* word 14 */
	uint64_t gc_count;           /* word 15 */
#else
	signed char device;          /* word 0 */
	CUstream_st *stream;         /* word 1 */
	BlockPool *pool;             /* word 2 */
	char *ptr;                   /* word 3 */
	Block *prev;                 /* word 4 */
	size_t size;                 /* word 5 */
	Block *next;                 /* word 6 */
	uintptr_t stream_uses[2];    /* words 7..8 */
	size_t requested_size;       /* word 9 */
	bool allocated;              /* word 10 */
	uint64_t event_count;        /* word 11 */
	uint64_t gc_count;           /* word 12 */
	uint64_t spare[3];           /* words 13..15 */
#endif
};

#ifndef SIM_TORCH_ALT_LAYOUT
static_assert(offsetof(Block, size) == 7 * 8, "size at word 7");
static_assert(offsetof(Block, requested_size) == 8 * 8, "requested_size at word 8");
static_assert(offsetof(Block, ptr) == 10 * 8, "ptr at word 10");
#else
static_assert(offsetof(Block, size) == 5 * 8, "size at word 5");
static_assert(offsetof(Block, requested_size) == 9 * 8, "requested_size at word 9");
static_assert(offsetof(Block, ptr) == 3 * 8, "ptr at word 3");
#endif
static_assert(sizeof(Block) == 16 * 8, "the tracer reads 16 words");

/* The free blocks of one pool. */
struct BlockPool {
	std::vector<Block *> blocks;
	bool is_small;
};

size_t round_size(size_t size)
{
	return size < kMinBlockSize ? kMinBlockSize : (size + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

/* The segment size cudaMalloc'd for a (rounded) request. */
size_t allocation_size(size_t size)
{
	if (size <= kSmallSize)
		return kSmallBuffer;
	if (size < kMinLargeAlloc)
		return kLargeBuffer;
	return (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

Block *new_block(BlockPool *pool, CUstream_st *stream, char *ptr, size_t size)
{
	Block *b = new Block();
	b->stream = stream;
	b->pool = pool;
	b->ptr = ptr;
	b->size = size;
	/* Like an empty std::unordered_set: a bucket pointer into itself and one bucket. */
	b->stream_uses[0] = reinterpret_cast<uintptr_t>(&b->stream_uses[1]);
	b->stream_uses[1] = 1;
	return b;
}

void pool_remove(BlockPool &pool, Block *b)
{
	for (auto it = pool.blocks.begin(); it != pool.blocks.end(); ++it)
		if (*it == b) {
			pool.blocks.erase(it);
			return;
		}
}

/* Best fit: the smallest free block of the stream that holds `size`, lowest address on ties. */
Block *find_free(BlockPool &pool, size_t size, CUstream_st *stream)
{
	Block *best = nullptr;
	for (Block *b : pool.blocks)
		if (b->stream == stream && b->size >= size &&
		    (!best || b->size < best->size || (b->size == best->size && b->ptr < best->ptr)))
			best = b;
	if (best)
		pool_remove(pool, best);
	return best;
}

bool should_split(const Block *b, size_t size)
{
	size_t remaining = b->size - size;
	return b->pool->is_small ? remaining >= kMinBlockSize : remaining > kSmallSize;
}

/* Merges free neighbour `src` into `dst` (they are adjacent in one segment). */
void merge(Block *dst, Block *src)
{
	if (!src || src->allocated)
		return;
	if (dst->prev == src) {
		dst->ptr = src->ptr;
		dst->prev = src->prev;
		if (dst->prev)
			dst->prev->next = dst;
	} else {
		dst->next = src->next;
		if (dst->next)
			dst->next->prev = dst;
	}
	dst->size += src->size;
	pool_remove(*src->pool, src);
	delete src;
}

} // namespace

class DeviceCachingAllocator {
      public:
#ifdef SIM_TORCH_MALLOC_NO_STREAM
	SIM_ENTRY Block *malloc(unsigned long orig_size);
#else
	SIM_ENTRY Block *malloc(unsigned long orig_size, CUstream_st *stream);
#endif
	SIM_ENTRY void free(Block *block);
	SIM_ENTRY void release_block(Block *block, const std::shared_ptr<GatheredContext> &context);
	/* emptyCache's work: releases every segment that is one free block. */
	SIM_ENTRY void release_cached_blocks();

      private:
	BlockPool small_blocks{ {}, true };
	BlockPool large_blocks{ {}, false };
};

#ifdef SIM_TORCH_MALLOC_NO_STREAM
Block *DeviceCachingAllocator::malloc(unsigned long orig_size)
{
	CUstream_st *stream = nullptr;
#else
Block *DeviceCachingAllocator::malloc(unsigned long orig_size, CUstream_st *stream)
{
#endif
	size_t size = round_size(orig_size);
	BlockPool &pool = size <= kSmallSize ? small_blocks : large_blocks;
	Block *block = find_free(pool, size, stream);
	if (!block) {
		size_t alloc = allocation_size(size);
		void *p = nullptr;
		if (cudaMalloc(&p, alloc) != 0)
			return nullptr;
		block = new_block(&pool, stream, static_cast<char *>(p), alloc);
	}
	if (should_split(block, size)) {
		Block *rest = new_block(&pool, stream, block->ptr + size, block->size - size);
		rest->prev = block;
		rest->next = block->next;
		if (rest->next)
			rest->next->prev = rest;
		block->next = rest;
		block->size = size;
		pool.blocks.push_back(rest);
	}
	block->allocated = true;
	block->requested_size = orig_size;
	return block;
}

void DeviceCachingAllocator::free(Block *block)
{
	block->allocated = false;
	block->requested_size = 0;
	merge(block, block->prev);
	merge(block, block->next);
	block->pool->blocks.push_back(block);
}

void DeviceCachingAllocator::release_block(Block *block, const std::shared_ptr<GatheredContext> &context)
{
	(void)context;
	cudaFree(block->ptr);
	pool_remove(*block->pool, block);
	delete block;
}

void DeviceCachingAllocator::release_cached_blocks()
{
	std::shared_ptr<GatheredContext> context;
	for (BlockPool *pool : { &small_blocks, &large_blocks }) {
		std::vector<Block *> whole;
		for (Block *b : pool->blocks)
			if (!b->prev && !b->next)
				whole.push_back(b);
		for (Block *b : whole)
			release_block(b, context);
	}
}

class NativeCachingAllocator {
      public:
	SIM_ENTRY void emptyCache(std::pair<unsigned long long, unsigned long long> mempool_id);
	DeviceCachingAllocator device_allocator;
};

void NativeCachingAllocator::emptyCache(std::pair<unsigned long long, unsigned long long> mempool_id)
{
	(void)mempool_id;
	device_allocator.release_cached_blocks();
}

} // namespace Native
} // namespace CUDACachingAllocator
} // namespace cuda
} // namespace c10

using c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator;

static NativeCachingAllocator sim_allocator;

extern "C" {
void *simTorchMalloc(unsigned long size)
{
	if (size == 0)
		return nullptr;
#ifdef SIM_TORCH_MALLOC_NO_STREAM
	return sim_allocator.device_allocator.malloc(size);
#else
	return sim_allocator.device_allocator.malloc(size, nullptr);
#endif
}

void simTorchFree(void *handle)
{
	using c10::cuda::CUDACachingAllocator::Native::Block;
	if (handle)
		sim_allocator.device_allocator.free(static_cast<Block *>(handle));
}

void simTorchEmptyCache(void)
{
	sim_allocator.emptyCache({ 0, 0 });
}
}
