// The CUDA backend's entry points in a build without CUDA: the backend reports itself absent.
#include "kernels/cuda/cuda_ops.hpp"

#ifndef CEDAR_HAVE_CUDA
namespace cedar::cuda {

bool available() { return false; }
std::string status() { return "built without CUDA"; }

}  // namespace cedar::cuda
#endif
