/*
 * cuda_emu.h - just enough of CUDA's device vocabulary, in host C++, to compile the device code
 * of src/backend/cuda/cu_quant.cuh on a machine without CUDA and test it against the CPU
 * reference (tests/test_cuda_layout.cpp). Semantics follow the CUDA documentation: __byte_perm
 * selects bytes of {y:x} by the low three bits of each selector nibble; __ldg is a plain load
 * that also records a misaligned vector load (which a GPU would fault on).
 */
#ifndef TOAST_TESTS_CUDA_EMU_H
#define TOAST_TESTS_CUDA_EMU_H

#define TOAST_CUDA_EMU 1

#include <math.h>
#include <stdint.h>
#include <string.h>

extern "C" {
#include "backend/backend.h"
#include "util/half.h"
}

#define __host__
#define __device__
#define __global__
#define __forceinline__ inline

struct uint2 {
	unsigned x, y;
};
struct uint4 {
	unsigned x, y, z, w;
};
struct float2 {
	float x, y;
};
struct float4 {
	float x, y, z, w;
};
static inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

static long emu_misaligned; /* vector loads a GPU would refuse */

template <typename T>
static inline T __ldg(const T *p)
{
	if ((uintptr_t)p % sizeof(T))
		emu_misaligned++;
	T v;
	memcpy(&v, p, sizeof(T));
	return v;
}

static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s)
{
	uint8_t b[8];
	memcpy(b, &x, 4);
	memcpy(b + 4, &y, 4);
	unsigned r = 0;
	for (int n = 0; n < 4; n++)
		r |= (unsigned)b[(s >> (4 * n)) & 7] << (8 * n);
	return r;
}

static inline float __uint_as_float(unsigned u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

struct __half {
	unsigned short x;
};
struct __half2 {
	__half x, y;
};
static inline __half __ushort_as_half(unsigned short h) { return {h}; }
static inline float __half2float(__half h) { return toast_f16_to_f32(h.x); }
static inline float2 __half22float2(__half2 h) { return {__half2float(h.x), __half2float(h.y)}; }

typedef uint16_t bf16;
struct cuda_backend;

/* 8 bf16 in a uint4 -> 8 floats (cuda_common.cuh) */
static inline void cu_bf16x8(uint4 u, float *f)
{
	unsigned w[4] = {u.x, u.y, u.z, u.w};
	for (int i = 0; i < 4; i++) {
		f[2 * i] = __uint_as_float(w[i] << 16);
		f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
	}
}

#endif
