// cuBLASLt is loaded when the CUDA backend starts, not linked (src/backend/cuda/cublaslt_api.h): the
// programs do not need the library to start, and the loader finds it or says why not. None of this
// needs a GPU.
#include <gtest/gtest.h>

#ifdef KEV_HAVE_CUDA
#include <unistd.h>

#include <cstdio>
#include <string>

#include "backend/cuda/cublaslt_api.h"

namespace kev::cuda {
namespace {

// The library this build's header names loads, and reports the header's major version.
TEST(CublasLtLoader, LoadsTheLibraryOfTheHeader) {
  const Result<const CublasLtApi*> lt = load_cublaslt();
  ASSERT_TRUE(lt.ok()) << lt.status().to_string();
  EXPECT_EQ(lt.value()->cublasLtGetVersion() / 10000, static_cast<size_t>(CUBLAS_VER_MAJOR));
  EXPECT_EQ(load_cublaslt().value(), lt.value()) << "loaded once per process";
  EXPECT_STREQ(lt.value()->cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
}

TEST(CublasLtLoader, AMissingLibraryIsADeviceErrorNamingIt) {
  const Result<CublasLtApi> lt =
      load_cublaslt_from({"libkev-test-no-such-cublasLt.so.1", "/nonexistent/libcublasLt.so"});
  ASSERT_FALSE(lt.ok());
  EXPECT_EQ(lt.status().code(), ErrorCode::Device);
  const std::string msg = lt.status().to_string();
  EXPECT_NE(msg.find("cannot load cuBLASLt"), std::string::npos) << msg;
  EXPECT_NE(msg.find("libkev-test-no-such-cublasLt.so.1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("/nonexistent/libcublasLt.so"), std::string::npos) << msg;
}

// A library without cuBLASLt's entry points (the C library) is refused, naming what it lacks.
TEST(CublasLtLoader, ALibraryWithoutTheEntryPointsIsRefused) {
  const Result<CublasLtApi> lt = load_cublaslt_from({"libc.so.6"});
  ASSERT_FALSE(lt.ok());
  EXPECT_NE(lt.status().to_string().find("lacks cublasLtCreate"), std::string::npos) << lt.status().to_string();
}

// This program links the CUDA backend but not libcublasLt (ldd lists what the loader maps at start).
TEST(CublasLtLoader, TheProgramDoesNotLinkIt) {
  char exe[4096] = {};
  ASSERT_GT(readlink("/proc/self/exe", exe, sizeof exe - 1), 0);
  FILE* p = popen(("ldd '" + std::string(exe) + "' 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, p)) out += buf;
  pclose(p);
  ASSERT_NE(out.find("libc.so"), std::string::npos) << "ldd printed no libraries:\n" << out;
  EXPECT_EQ(out.find("libcublas"), std::string::npos) << out;
}

}  // namespace
}  // namespace kev::cuda
#endif
