// kev_pipeline_stats: what the Vulkan driver compiles the WebGPU kernels to — registers, shared memory,
// spills, as the driver reports them (VK_KHR_pipeline_executable_properties).
//
//   KEV_WEBGPU_DUMP_SPIRV=/tmp/spv kev_benchmark --backend webgpu ...   # Dawn's SPIR-V, one file a pipeline
//   kev_pipeline_stats /tmp/spv [--device H200]
//
// Each <file>.<entry>.spvasm (the disassembly Dawn logs under its `dump_shaders` toggle) is assembled
// with SPIRV-Tools, its descriptor bindings and push constants are read from the module, and a compute
// pipeline is created from it on the chosen Vulkan device with statistics captured. Prints one line a
// pipeline: its name, then each statistic of each executable as name=value. A driver without the
// extension (lavapipe) still builds every pipeline, which checks the modules, and says it has no
// statistics. The SPIR-V is what Dawn generated for the adapter it ran on; run both on the same machine.
// Exit codes: 0 every pipeline built, 1 usage, 2 a file, module or Vulkan error.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <spirv-tools/libspirv.h>
#include <vulkan/vulkan.h>

namespace {

namespace fs = std::filesystem;

struct Failure {
  std::string what;
};

// A zeroed Vulkan structure of the given type.
template <typename T>
T vk_struct(VkStructureType type) {
  T t{};
  t.sType = type;
  return t;
}

void vk_check(VkResult r, const char* call) {
  if (r != VK_SUCCESS) throw Failure{std::string(call) + " failed: VkResult " + std::to_string(r)};
}

// Vulkan's two-call enumeration: get(&n, nullptr) for the count, then n structures of `type` filled.
template <typename T, typename Get>
std::vector<T> enumerate(VkStructureType type, const char* call, Get get) {
  uint32_t n = 0;
  vk_check(get(&n, nullptr), call);
  std::vector<T> items(n, vk_struct<T>(type));
  vk_check(get(&n, items.data()), call);
  items.resize(n);
  return items;
}

// What a pipeline layout needs from a module: (set, binding) -> descriptor type, the push-constant use
// and the entry point's name (Dawn renames it).
struct ModuleInterface {
  std::map<std::pair<uint32_t, uint32_t>, VkDescriptorType> bindings;
  bool push_constants = false;
  std::string entry;
};

// Reads OpEntryPoint, OpDecorate DescriptorSet / Binding and the storage class of each OpVariable.
ModuleInterface read_interface(const std::vector<uint32_t>& words) {
  constexpr uint32_t kOpEntryPoint = 15, kOpDecorate = 71, kOpVariable = 59;
  constexpr uint32_t kDecorationBinding = 33, kDecorationDescriptorSet = 34;
  constexpr uint32_t kUniform = 2, kStorageBuffer = 12, kPushConstant = 9;
  std::map<uint32_t, uint32_t> set_of, binding_of, class_of;
  ModuleInterface m;
  for (size_t i = 5; i < words.size();) {
    const uint32_t op = words[i] & 0xffff, n = words[i] >> 16;
    if (n == 0 || i + n > words.size()) throw Failure{"malformed SPIR-V instruction stream"};
    const uint32_t* a = &words[i + 1];
    if (op == kOpEntryPoint && n >= 4 && m.entry.empty()) {
      m.entry = reinterpret_cast<const char*>(&a[2]);  // nul-terminated, padded to words
    } else if (op == kOpDecorate && n >= 4 && a[1] == kDecorationDescriptorSet) {
      set_of[a[0]] = a[2];
    } else if (op == kOpDecorate && n >= 4 && a[1] == kDecorationBinding) {
      binding_of[a[0]] = a[2];
    } else if (op == kOpVariable && n >= 4) {
      class_of[a[1]] = a[2];
      if (a[2] == kPushConstant) m.push_constants = true;
    }
    i += n;
  }
  for (const auto& [id, binding] : binding_of) {
    const auto set = set_of.find(id);
    const auto cls = class_of.find(id);
    if (set == set_of.end() || cls == class_of.end()) continue;
    if (cls->second != kUniform && cls->second != kStorageBuffer)
      throw Failure{"binding " + std::to_string(binding) + " has storage class " + std::to_string(cls->second) +
                    ", not a uniform or storage buffer"};
    m.bindings[{set->second, binding}] =
        cls->second == kUniform ? VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER : VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
  }
  if (m.entry.empty()) throw Failure{"no OpEntryPoint"};
  return m;
}

std::vector<uint32_t> assemble(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw Failure{"cannot read " + path.string()};
  std::stringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  spv_context ctx = spvContextCreate(SPV_ENV_VULKAN_1_1);
  spv_binary binary = nullptr;
  spv_diagnostic diag = nullptr;
  const spv_result_t r = spvTextToBinary(ctx, s.data(), s.size(), &binary, &diag);
  std::string error;
  if (r != SPV_SUCCESS) error = diag != nullptr ? diag->error : "spvTextToBinary failed";
  std::vector<uint32_t> words;
  if (binary != nullptr) words.assign(binary->code, binary->code + binary->wordCount);
  spvBinaryDestroy(binary);
  spvDiagnosticDestroy(diag);
  spvContextDestroy(ctx);
  if (!error.empty()) throw Failure{path.string() + ": " + error};
  return words;
}

std::string statistic_value(const VkPipelineExecutableStatisticKHR& s) {
  switch (s.format) {
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR: return s.value.b32 ? "true" : "false";
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR: return std::to_string(s.value.i64);
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR: return std::to_string(s.value.u64);
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR: return std::to_string(s.value.f64);
    default: return "?";
  }
}

class Vulkan {
 public:
  explicit Vulkan(const std::string& device_choice) {
    auto app = vk_struct<VkApplicationInfo>(VK_STRUCTURE_TYPE_APPLICATION_INFO);
    app.pApplicationName = "kev_pipeline_stats";
    app.apiVersion = VK_API_VERSION_1_3;
    auto ici = vk_struct<VkInstanceCreateInfo>(VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO);
    ici.pApplicationInfo = &app;
    vk_check(vkCreateInstance(&ici, nullptr, &instance_), "vkCreateInstance");
    uint32_t n = 0;
    vk_check(vkEnumeratePhysicalDevices(instance_, &n, nullptr), "vkEnumeratePhysicalDevices");
    std::vector<VkPhysicalDevice> devices(n);
    vk_check(vkEnumeratePhysicalDevices(instance_, &n, devices.data()), "vkEnumeratePhysicalDevices");
    std::string names;
    for (VkPhysicalDevice d : devices) {
      VkPhysicalDeviceProperties p;
      vkGetPhysicalDeviceProperties(d, &p);
      names += std::string(names.empty() ? "" : "; ") + p.deviceName;
      const bool discrete = p.deviceType == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU;
      const bool better = device_choice.empty()
                              ? physical_ == VK_NULL_HANDLE ||
                                    (discrete && props_.deviceType != VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU)
                              : physical_ == VK_NULL_HANDLE && std::strstr(p.deviceName, device_choice.c_str());
      if (better) {
        physical_ = d;
        props_ = p;
      }
    }
    if (physical_ == VK_NULL_HANDLE)
      throw Failure{"no Vulkan device matches '" + device_choice + "'; found: " + (names.empty() ? "none" : names)};

    uint32_t n_ext = 0;
    vkEnumerateDeviceExtensionProperties(physical_, nullptr, &n_ext, nullptr);
    std::vector<VkExtensionProperties> exts(n_ext);
    vkEnumerateDeviceExtensionProperties(physical_, nullptr, &n_ext, exts.data());
    statistics_ = std::any_of(exts.begin(), exts.end(), [](const VkExtensionProperties& e) {
      return std::strcmp(e.extensionName, VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME) == 0;
    });

    // Every core feature the device has (Dawn's modules may use workgroup zero-initialisation, the
    // Vulkan memory model, subgroup operations, ...; robustBufferAccess stays on, as Dawn's devices have
    // it), plus executable statistics where offered.
    auto exec = vk_struct<VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR);
    auto f13 = vk_struct<VkPhysicalDeviceVulkan13Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES);
    auto f12 = vk_struct<VkPhysicalDeviceVulkan12Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES);
    auto f11 = vk_struct<VkPhysicalDeviceVulkan11Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES);
    auto features = vk_struct<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
    features.pNext = &f11;
    f11.pNext = &f12;
    f12.pNext = &f13;
    if (statistics_) f13.pNext = &exec;
    vkGetPhysicalDeviceFeatures2(physical_, &features);

    uint32_t n_families = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(physical_, &n_families, nullptr);
    std::vector<VkQueueFamilyProperties> families(n_families);
    vkGetPhysicalDeviceQueueFamilyProperties(physical_, &n_families, families.data());
    uint32_t family = n_families;
    for (uint32_t i = 0; i < n_families && family == n_families; ++i) {
      if (families[i].queueFlags & VK_QUEUE_COMPUTE_BIT) family = i;
    }
    if (family == n_families) throw Failure{std::string(props_.deviceName) + " has no compute queue"};
    const float priority = 1.0f;
    auto qci = vk_struct<VkDeviceQueueCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO);
    qci.queueFamilyIndex = family;
    qci.queueCount = 1;
    qci.pQueuePriorities = &priority;
    const char* ext_name = VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME;
    auto dci = vk_struct<VkDeviceCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO);
    dci.pNext = &features;
    dci.queueCreateInfoCount = 1;
    dci.pQueueCreateInfos = &qci;
    dci.enabledExtensionCount = statistics_ ? 1 : 0;
    dci.ppEnabledExtensionNames = &ext_name;
    vk_check(vkCreateDevice(physical_, &dci, nullptr, &device_), "vkCreateDevice");
    if (statistics_) {
      get_executables_ = reinterpret_cast<PFN_vkGetPipelineExecutablePropertiesKHR>(
          vkGetDeviceProcAddr(device_, "vkGetPipelineExecutablePropertiesKHR"));
      get_statistics_ = reinterpret_cast<PFN_vkGetPipelineExecutableStatisticsKHR>(
          vkGetDeviceProcAddr(device_, "vkGetPipelineExecutableStatisticsKHR"));
      statistics_ = get_executables_ != nullptr && get_statistics_ != nullptr;
    }
  }
  ~Vulkan() {
    if (device_ != VK_NULL_HANDLE) vkDestroyDevice(device_, nullptr);
    if (instance_ != VK_NULL_HANDLE) vkDestroyInstance(instance_, nullptr);
  }
  Vulkan(const Vulkan&) = delete;
  Vulkan& operator=(const Vulkan&) = delete;

  std::string describe() const {
    return std::string(props_.deviceName) + ", Vulkan " + std::to_string(VK_API_VERSION_MAJOR(props_.apiVersion)) +
           "." + std::to_string(VK_API_VERSION_MINOR(props_.apiVersion)) + ", driver version " +
           std::to_string(props_.driverVersion) +
           (statistics_ ? "" : "; no VK_KHR_pipeline_executable_properties: pipelines are built, no statistics");
  }

  // Builds the module's pipeline and returns its statistics line (or "built" without statistics).
  std::string statistics(const std::vector<uint32_t>& spirv, const ModuleInterface& m) {
    std::map<uint32_t, std::vector<VkDescriptorSetLayoutBinding>> sets;
    for (const auto& [where, type] : m.bindings) {
      VkDescriptorSetLayoutBinding b{};
      b.binding = where.second;
      b.descriptorType = type;
      b.descriptorCount = 1;
      b.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
      sets[where.first].push_back(b);
    }
    const uint32_t n_sets = sets.empty() ? 0 : sets.rbegin()->first + 1;
    std::vector<VkDescriptorSetLayout> set_layouts(n_sets, VK_NULL_HANDLE);
    VkShaderModule module = VK_NULL_HANDLE;
    VkPipelineLayout layout = VK_NULL_HANDLE;
    VkPipeline pipeline = VK_NULL_HANDLE;
    std::string line, error;
    try {
      for (uint32_t s = 0; s < n_sets; ++s) {
        const std::vector<VkDescriptorSetLayoutBinding>& b = sets[s];
        auto sci = vk_struct<VkDescriptorSetLayoutCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO);
        sci.bindingCount = static_cast<uint32_t>(b.size());
        sci.pBindings = b.data();
        vk_check(vkCreateDescriptorSetLayout(device_, &sci, nullptr, &set_layouts[s]), "vkCreateDescriptorSetLayout");
      }
      const VkPushConstantRange push{VK_SHADER_STAGE_COMPUTE_BIT, 0, props_.limits.maxPushConstantsSize};
      auto lci = vk_struct<VkPipelineLayoutCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO);
      lci.setLayoutCount = n_sets;
      lci.pSetLayouts = set_layouts.data();
      lci.pushConstantRangeCount = m.push_constants ? 1 : 0;
      lci.pPushConstantRanges = &push;
      vk_check(vkCreatePipelineLayout(device_, &lci, nullptr, &layout), "vkCreatePipelineLayout");
      auto mci = vk_struct<VkShaderModuleCreateInfo>(VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO);
      mci.codeSize = spirv.size() * sizeof(uint32_t);
      mci.pCode = spirv.data();
      vk_check(vkCreateShaderModule(device_, &mci, nullptr, &module), "vkCreateShaderModule");
      auto pci = vk_struct<VkComputePipelineCreateInfo>(VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO);
      pci.flags = statistics_ ? VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR : 0;
      pci.stage = vk_struct<VkPipelineShaderStageCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO);
      pci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
      pci.stage.module = module;
      pci.stage.pName = m.entry.c_str();
      pci.layout = layout;
      vk_check(vkCreateComputePipelines(device_, VK_NULL_HANDLE, 1, &pci, nullptr, &pipeline),
               "vkCreateComputePipelines");
      line = statistics_ ? executable_statistics(pipeline) : "built";
    } catch (const Failure& f) {
      error = f.what;
    }
    if (pipeline != VK_NULL_HANDLE) vkDestroyPipeline(device_, pipeline, nullptr);
    if (module != VK_NULL_HANDLE) vkDestroyShaderModule(device_, module, nullptr);
    if (layout != VK_NULL_HANDLE) vkDestroyPipelineLayout(device_, layout, nullptr);
    for (VkDescriptorSetLayout s : set_layouts) {
      if (s != VK_NULL_HANDLE) vkDestroyDescriptorSetLayout(device_, s, nullptr);
    }
    if (!error.empty()) throw Failure{error};
    return line;
  }

 private:
  std::string executable_statistics(VkPipeline pipeline) {
    auto info = vk_struct<VkPipelineInfoKHR>(VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR);
    info.pipeline = pipeline;
    const auto execs = enumerate<VkPipelineExecutablePropertiesKHR>(
        VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_PROPERTIES_KHR, "vkGetPipelineExecutablePropertiesKHR",
        [&](uint32_t* n, VkPipelineExecutablePropertiesKHR* out) { return get_executables_(device_, &info, n, out); });
    std::string line;
    for (uint32_t e = 0; e < execs.size(); ++e) {
      auto ei = vk_struct<VkPipelineExecutableInfoKHR>(VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR);
      ei.pipeline = pipeline;
      ei.executableIndex = e;
      const auto stats = enumerate<VkPipelineExecutableStatisticKHR>(
          VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR, "vkGetPipelineExecutableStatisticsKHR",
          [&](uint32_t* n, VkPipelineExecutableStatisticKHR* out) { return get_statistics_(device_, &ei, n, out); });
      if (execs.size() > 1) line += std::string(line.empty() ? "" : " | ") + execs[e].name + ":";
      line += " subgroup=" + std::to_string(execs[e].subgroupSize);
      for (const VkPipelineExecutableStatisticKHR& s : stats) {
        std::string name = s.name;
        std::replace(name.begin(), name.end(), ' ', '_');
        line += " " + name + "=" + statistic_value(s);
      }
    }
    return line.empty() ? "no executables" : line.substr(line[0] == ' ' ? 1 : 0);
  }

  VkInstance instance_ = VK_NULL_HANDLE;
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  VkPhysicalDeviceProperties props_{};
  VkDevice device_ = VK_NULL_HANDLE;
  bool statistics_ = false;
  PFN_vkGetPipelineExecutablePropertiesKHR get_executables_ = nullptr;
  PFN_vkGetPipelineExecutableStatisticsKHR get_statistics_ = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Vulkan driver statistics of the WebGPU kernels' SPIR-V (KEV_WEBGPU_DUMP_SPIRV's files)"};
  std::vector<std::string> inputs;
  std::string device;
  app.add_option("inputs", inputs, ".spvasm files, or directories holding them")->required();
  app.add_option("--device", device, "a Vulkan device whose name contains this (default: the first discrete one)");
  CLI11_PARSE(app, argc, argv);

  std::vector<fs::path> files;
  for (const std::string& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      for (const fs::directory_entry& e : fs::directory_iterator(in, ec)) {
        if (e.path().extension() == ".spvasm") files.push_back(e.path());
      }
    } else {
      files.emplace_back(in);
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "kev_pipeline_stats: no .spvasm files in the inputs given\n");
    return 1;
  }
  int failed = 0;
  try {
    Vulkan vk(device);
    std::printf("# %s\n", vk.describe().c_str());
    for (const fs::path& f : files) {
      try {
        const std::vector<uint32_t> spirv = assemble(f);
        const std::string line = vk.statistics(spirv, read_interface(spirv));
        std::printf("%-44s %s\n", f.stem().c_str(), line.c_str());
      } catch (const Failure& e) {
        std::printf("%-44s FAILED: %s\n", f.stem().c_str(), e.what.c_str());
        ++failed;
      }
    }
  } catch (const Failure& e) {
    std::fprintf(stderr, "kev_pipeline_stats: %s\n", e.what.c_str());
    return 2;
  }
  return failed == 0 ? 0 : 2;
}
