// Crash-safe file writes. A checkpoint is written to a temporary file in the target's directory, flushed
// to disk (fsync), renamed over the target (atomic on POSIX file systems) and the directory is fsynced so
// the rename itself survives a power loss. A reader therefore sees the old file or the new one, never a
// mix; and any failure — an unwritable directory, a full disk, an I/O error — removes the temporary file,
// leaves the previous file byte-identical and throws a demi::Error saying which step failed, on which
// path, and the system's reason.
//
//   AtomicFile f(path);           // creates "<dir>/.<name>.tmp-<pid>-<n>"
//   f.write(header.data(), header.size());
//   f.write(payload, n);
//   f.commit();                   // fsync, rename, fsync(dir); the destructor cleans up if never reached
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace demi::io {

// Failures injected for tests, as the operating system would report them (errno set, the same cleanup
// path taken): real disks cannot be filled or broken on demand in CI.
struct WriteFaults {
  int64_t fail_after_bytes = -1;  // write() fails with ENOSPC once this many bytes are written (-1: never)
  bool fail_fsync = false;        // fsync(file) fails with EIO
  bool fail_rename = false;       // rename() fails with EXDEV
  bool fail_dir_fsync = false;    // fsync(directory) fails with EIO (after the rename: the new file is in
                                  // place but not known to be durable)
};

struct AtomicWriteOptions {
  // fsync the file and the directory. Off only for scratch files whose durability does not matter.
  bool sync = true;
  const WriteFaults* faults = nullptr;  // tests only
};

class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path path, const AtomicWriteOptions& options = {});
  ~AtomicFile();  // removes the temporary file unless commit() succeeded
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  void commit();
  // Gives up: closes and removes the temporary file (also what the destructor does). Never throws.
  void abort() noexcept;

  const std::filesystem::path& path() const { return path_; }
  const std::filesystem::path& temp_path() const { return temp_; }
  uint64_t bytes_written() const { return written_; }

 private:
  [[noreturn]] void fail(const std::string& step, int err);

  std::filesystem::path path_;
  std::filesystem::path temp_;
  AtomicWriteOptions options_;
  int fd_ = -1;
  uint64_t written_ = 0;
  bool committed_ = false;
};

// Writes `bytes` to `path` atomically (an AtomicFile in one call).
void write_file_atomic(const std::filesystem::path& path, std::span<const uint8_t> bytes,
                       const AtomicWriteOptions& options = {});

// The whole file, or a demi::Error naming the path and the system's reason. `max_bytes` refuses larger
// files before anything is allocated.
std::vector<uint8_t> read_file(const std::filesystem::path& path, uint64_t max_bytes = UINT64_MAX);

// True for the temporary files AtomicFile creates (".<name>.tmp-<pid>-<n>"), so directory scans skip
// them and stale ones left by a killed process can be recognised.
bool is_atomic_temp_name(const std::string& filename);

// Removes the temporary files in `dir` whose writer process no longer runs (killed between creating the
// file and renaming it); a live writer's are left alone. Returns how many were removed.
int remove_stale_temp_files(const std::filesystem::path& dir);

}  // namespace demi::io
