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
