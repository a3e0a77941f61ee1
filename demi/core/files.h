// Where demi's files go: the per-machine cache folder, and scratch folders that a run creates and removes.
#pragma once

#include <filesystem>
#include <string>

namespace demi {

// Where demi keeps what it computes once per machine (the kernel choices, the GPT's text): $DEMI_CACHE_DIR,
// else $XDG_CACHE_HOME/demi, else ~/.cache/demi, else /tmp/demi-UID. Not created here.
std::string cache_dir();

// A new folder of its own in the temporary directory ("<prefix>-XXXXXX", made by mkdtemp: never one that
// existed before), removed with what it holds at the end of its scope. A demi::Error when it cannot be made.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix = "demi");
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

}  // namespace demi
