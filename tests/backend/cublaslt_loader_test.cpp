// cuBLASLt is loaded when the CUDA backend starts, not linked (src/backend/cuda/cublaslt_api.h): the
// programs do not need the library to start, and the loader finds it or says why not. None of this
// needs a GPU.
#include <gtest/gtest.h>

#ifdef KEV_HAVE_CUDA
#include <unistd.h>

#include <string>

#include "backend/cuda/cublaslt_api.h"
#include "support/run_command.h"

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

// The table's entry points reach the library: the host-side objects a GEMM plan is built from are
// created, configured and destroyed through it (no GPU needed for these; cublasLtCreate and the GEMM
// itself need one and run in the Cuda* tests).
TEST(CublasLtLoader, PlanObjectsGoThroughTheTable) {
  const Result<const CublasLtApi*> loaded = load_cublaslt();
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const CublasLtApi& lt = *loaded.value();
  cublasLtMatmulDesc_t op = nullptr;
  ASSERT_EQ(lt.cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  const cublasOperation_t trans = CUBLAS_OP_T;
  EXPECT_EQ(lt.cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans)),
            CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayout_t layout = nullptr;
  ASSERT_EQ(lt.cublasLtMatrixLayoutCreate(&layout, CUDA_R_32F, 64, 32, 64), CUBLAS_STATUS_SUCCESS);
  const int32_t count = 2;
  EXPECT_EQ(lt.cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
            CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulPreference_t pref = nullptr;
  ASSERT_EQ(lt.cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  const uint64_t workspace = 1 << 20;
  EXPECT_EQ(lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                    sizeof(workspace)),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(lt.cublasLtMatmulPreferenceDestroy(pref), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(lt.cublasLtMatrixLayoutDestroy(layout), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(lt.cublasLtMatmulDescDestroy(op), CUBLAS_STATUS_SUCCESS);
  // A failing call's status is named by the library in the Device error.
  const Status st = cublas_status(CUBLAS_STATUS_INVALID_VALUE, "cublasLtSomething(x)", "f.cpp", 7);
  EXPECT_EQ(st.code(), ErrorCode::Device);
  EXPECT_NE(st.to_string().find("CUBLAS_STATUS_INVALID_VALUE"), std::string::npos) << st.to_string();
  EXPECT_NE(st.to_string().find("cublasLtSomething(x)"), std::string::npos) << st.to_string();
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
  const std::string out = kev::test_support::run_command("ldd '" + std::string(exe) + "'").output;
  ASSERT_NE(out.find("libc.so"), std::string::npos) << "ldd printed no libraries:\n" << out;
  EXPECT_EQ(out.find("libcublas"), std::string::npos) << out;
}

}  // namespace
}  // namespace kev::cuda
#endif
