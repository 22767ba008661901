// evtc's own device functors and visitor nodes, for ops CUTLASS has no functor for.
// #included by every emitted kernel (codegen_templates/include is on nvcc's -I path). Each
// functor works on a scalar T and on cutlass::Array<T, N> (what Sm90Compute / VisitorCompute
// pass: fragments in the compute type).
#pragma once

#include <cutlass/cutlass.h>
#include <cutlass/array.h>
#include <cutlass/functional.h>
#include <cutlass/numeric_types.h>
#include <cuda_runtime.h>
#include <math.h>

namespace evtc {
namespace detail {

template <class Op, class T, int N>
struct Map1 {
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& a) const {
    cutlass::Array<T, N> r;
    Op op;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) { r[i] = op(a[i]); }
    return r;
  }
};

template <class Op, class T, int N>
struct Map2 {
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& a, cutlass::Array<T, N> const& b) const {
    cutlass::Array<T, N> r;
    Op op;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) { r[i] = op(a[i], b[i]); }
    return r;
  }
};

template <class Op, class T, int N>
struct Map3 {
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& a, cutlass::Array<T, N> const& b,
                                                      cutlass::Array<T, N> const& c) const {
    cutlass::Array<T, N> r;
    Op op;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) { r[i] = op(a[i], b[i], c[i]); }
    return r;
  }
};

CUTLASS_HOST_DEVICE float rsqrt(float x) {
#if defined(__CUDA_ARCH__)
  return ::rsqrtf(x);
#else
  return 1.0f / ::sqrtf(x);
#endif
}

// NOTE [GELU without erff]: x * Phi(x), Phi the standard normal CDF, evaluated as
// Phi(x) = 1 - h for x >= 0 and h for x < 0, with h = 0.5 erfc(|x| / sqrt 2) = 2^Q(|x|) and Q a
// degree-5 polynomial with Q(0) = -1 (a weighted least-squares fit of log2(0.5 erfc(t / sqrt 2))
// on [0, 5.6], reweighted towards the least largest absolute error of h; float32 coefficients,
// printed by benchmarks/micro/gelu_fit.py and checked by tests/null/test_gelu_polynomial.py),
// and x Phi(x) = 0.5 x + |x| (0.5 - h) in one FMA (for x >= 0 it is x - x h, for x < 0 it is x h):
// 5 FMAs, one ex2.approx.ftz, a subtraction, a multiplication and an FMA a value, against about
// 30 instructions for cutlass::epilogue::thread::GELU's 0.5 x (1 + erff(x / sqrt 2)) (CUDA's erff:
// two minimax polynomials whose coefficients are selected per value, and 1 - ex2(r) for
// |x| >= 1.0030).
// The mainloop pays for the epilogue's instructions even on ping-pong, whose epilogue runs under
// the other warpgroup's MMAs. On the MLP block's up-projection (M x 14336 x 4096 + bias, H100,
// CUDA graphs, time / cuBLAS's plain GEMM, docs/performance.md, issue 13, 2026-11-27):
//   * ping-pong 64x256: through erff 1.087-1.120 at M = 1024 and 1.035-1.036 at 2048, where the
//     tanh approximation took 1.025-1.031 and 0.983-0.985; with the degree-8 form this NOTE had
//     first 1.065-1.067 and 1.008-1.013;
//   * ping-pong 128x176 (four runs): the degree-8 form 1.042-1.066 at M = 1024 and 0.981-0.996
//     at 2048, degree 8 with this ending 1.037-1.062 / 0.957-0.990, degree 6 clamped at 6
//     1.030-1.042 / 0.945-0.986, this degree 5 **1.022-1.027 / 0.944-0.971**, the tanh
//     approximation 1.013-1.043 / 0.953-0.962 and the bias alone 1.008-1.010 / 0.943-0.958.
// A branch-free erff (the same two polynomials, selected) gained nothing: ptxas already
// predicates erff's branch.
// Error: |h - 0.5 erfc(|x| / sqrt 2)| <= 7.2 u (u = 2^-24) with ex2.approx's 2 ulp, and 0.5 - h
// rounds by at most u / 4; so |gelu(x) - x Phi(x)| <= 7.5 u |x| + u |gelu(x)| / 2, inside the
// 8 u (|x| + |r|) that evtc.testing grants erff's form. Measured over all 2^32 inputs against a
// float64 reference on the H100 (benchmarks/micro/gelu_check.cu): at most 5.31 u
// (|x| + |gelu(x)|) (the degree-8 form 1.62, erff's form 1.00), every NaN and infinity where
// the reference has one. Q decreases on all of [0, inf) (its leading coefficient is negative and
// Q' < 0 past the fit's range, checked to 1e38), so no clamp is needed: h(+inf) = 0,
// gelu(+inf) = +inf * 0.5 + 0.5 * +inf = +inf, gelu(-inf) = +inf * 0.5 + 0.5 * -inf = NaN as
// erff's form gives, NaN stays NaN.
CUTLASS_HOST_DEVICE float gelu(float x) {
#if defined(__CUDA_ARCH__)
  float const t = ::fabsf(x);
  float q = -0x1.10dd72p-11f;
  q = ::fmaf(q, t, 0x1.e4ccdep-8f);
  q = ::fmaf(q, t, -0x1.ae94c2p-5f);
  q = ::fmaf(q, t, -0x1.d646dep-2f);
  q = ::fmaf(q, t, -0x1.26adecp+0f);
  q = ::fmaf(q, t, -1.0f);
  float h;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(h) : "f"(q));
  return ::fmaf(t, 0.5f - h, 0.5f * x);
#else
  return 0.5f * x * (1.0f + ::erff(x * 0.70710678118654752f));
#endif
}

}  // namespace detail

#define EVTC_UNARY(NAME, EXPR)                                                          \
  template <class T> struct NAME {                                                      \
    CUTLASS_HOST_DEVICE T operator()(T const& x_) const { float x = float(x_); return T(EXPR); } \
  };                                                                                    \
  template <class T, int N> struct NAME<cutlass::Array<T, N>> : detail::Map1<NAME<T>, T, N> {};

#define EVTC_BINARY(NAME, EXPR)                                                         \
  template <class T> struct NAME {                                                      \
    CUTLASS_HOST_DEVICE T operator()(T const& a_, T const& b_) const {                  \
      float a = float(a_), b = float(b_); return T(EXPR); }                              \
  };                                                                                    \
  template <class T, int N> struct NAME<cutlass::Array<T, N>> : detail::Map2<NAME<T>, T, N> {};

EVTC_UNARY(Exp, ::expf(x))
EVTC_UNARY(Log, ::logf(x))
EVTC_UNARY(Sqrt, ::sqrtf(x))
EVTC_UNARY(Rsqrt, detail::rsqrt(x))
EVTC_UNARY(Abs, ::fabsf(x))
EVTC_UNARY(Erf, ::erff(x))
// x * Phi(x) (NOTE [GELU without erff])
EVTC_UNARY(Gelu, detail::gelu(x))
// d/dx [x * Phi(x)] = Phi(x) + x * phi(x), Phi the standard normal CDF, phi its density
EVTC_UNARY(GeluGrad, 0.5f * (1.0f + ::erff(x * 0.70710678118654752f)) + x * 0.39894228040143268f * ::expf(-0.5f * x * x))

EVTC_BINARY(Pow, ::powf(a, b))
EVTC_BINARY(LeakyReLU, a > 0.0f ? a : a * b)
EVTC_BINARY(Greater, a > b ? 1.0f : 0.0f)
EVTC_BINARY(GreaterEqual, a >= b ? 1.0f : 0.0f)
EVTC_BINARY(Less, a < b ? 1.0f : 0.0f)
EVTC_BINARY(LessEqual, a <= b ? 1.0f : 0.0f)
EVTC_BINARY(Equal, a == b ? 1.0f : 0.0f)
EVTC_BINARY(NotEqual, a != b ? 1.0f : 0.0f)
// first(a, b) = a: keeps an output that is off the path to D inside the visitor tree
EVTC_BINARY(First, a)

#undef EVTC_UNARY
#undef EVTC_BINARY

template <class T> struct Where {
  CUTLASS_HOST_DEVICE T operator()(T const& c, T const& a, T const& b) const { return float(c) != 0.0f ? a : b; }
};
template <class T, int N> struct Where<cutlass::Array<T, N>> : detail::Map3<Where<T>, T, N> {};

// Atomic minimum on float, the counterpart of cutlass::atomic_maximum<float> (functional.h):
// non-negative floats order like signed ints, negative floats like reversed unsigned ints.
template <class T> struct atomic_minimum;
template <> struct atomic_minimum<float> {
  CUTLASS_DEVICE float operator()(float* ptr, float value) const {
#if defined(__CUDA_ARCH__)
    return !::signbit(value) ? __int_as_float(atomicMin((int*)ptr, __float_as_int(value)))
                             : __uint_as_float(atomicMax((unsigned int*)ptr, __float_as_uint(value)));
#else
    return value;
#endif
  }
};

}  // namespace evtc

namespace cutlass {
template <class T> struct is_atomic<evtc::atomic_minimum<T>> : platform::true_type {};
}  // namespace cutlass
