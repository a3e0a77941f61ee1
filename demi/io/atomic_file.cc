// AtomicFile: temporary file + fsync + rename + fsync(directory); see atomic_file.h. Plain POSIX calls
// (not iostreams) so that every failure has an errno to report and fsync can be called on the same fd.
#include "demi/io/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "demi/core/error.h"

namespace demi::io {
namespace {

std::atomic<uint64_t> g_temp_counter{0};

std::filesystem::path parent_dir(const std::filesystem::path& p) {
  auto d = p.parent_path();
  return d.empty() ? std::filesystem::path(".") : d;
}

// fsync on a directory: some file systems refuse it (EINVAL); there is nothing more we can do there.
int fsync_dir(const std::filesystem::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno;
  int err = ::fsync(fd) == 0 ? 0 : errno;
  ::close(fd);
  return err == EINVAL ? 0 : err;
}

// The file an atomic write replaces: `path`, or where its symlinks lead (followed, so the link stays a
// link and the file it names is replaced in its own directory). What is there must be a regular file or
// nothing: renaming over a device, a FIFO, a socket or a directory would replace it with a regular file
// (`--report /dev/full` once turned the device node into a 23 KB file).
std::filesystem::path write_target(const std::filesystem::path& path) {
  std::filesystem::path p = path;
  for (int hops = 0;; ++hops) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0) {
      const int err = errno;
      if (err == ENOENT) return p;  // a new file (its directory is checked by the temporary file's creation)
      throw Error(str_cat("cannot write '", path.string(), "': ", p == path ? "" : str_cat("'", p.string(), "': "),
                          std::strerror(err)));
    }
    if (S_ISLNK(st.st_mode)) {
      DEMI_CHECK(hops < 40, "cannot write '", path.string(), "': more than 40 symbolic links on the way");
      std::error_code ec;
      const std::filesystem::path target = std::filesystem::read_symlink(p, ec);
      DEMI_CHECK(!ec, "cannot write '", path.string(), "': reading the symbolic link '", p.string(), "': ", ec.message());
      p = target.is_absolute() ? target : parent_dir(p) / target;
      continue;
    }
    if (S_ISREG(st.st_mode)) return p;
    const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "not a regular file";
    throw Error(str_cat("cannot write '", path.string(), "': ", p == path ? "it" : str_cat("it leads to '", p.string(), "', which"),
                        " is ", kind, ", not a regular file; demi writes files atomically (a new file renamed "
                        "into place), which would replace it: give the path of a file"));
  }
}

}  // namespace

bool is_atomic_temp_name(const std::string& filename) {
  return filename.size() > 1 && filename[0] == '.' && filename.find(".tmp-") != std::string::npos;
}

int remove_stale_temp_files(const std::filesystem::path& dir) {
  int removed = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (!is_atomic_temp_name(name)) continue;
    size_t at = name.rfind(".tmp-");
    long pid = std::strtol(name.c_str() + at + 5, nullptr, 10);
    if (pid <= 0 || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)) {
      std::error_code rm;
      if (std::filesystem::remove(it->path(), rm)) ++removed;
    }
  }
  return removed;
}

AtomicFile::AtomicFile(std::filesystem::path path, const AtomicWriteOptions& options)
    : path_(std::move(path)), options_(options) {
  DEMI_CHECK(!path_.filename().empty(), "cannot write '", path_.string(), "': the path names no file");
  path_ = write_target(path_);
  temp_ = parent_dir(path_) / str_cat(".", path_.filename().string(), ".tmp-", ::getpid(), "-",
                                      g_temp_counter.fetch_add(1));
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    int err = errno;
    throw Error(str_cat("cannot write '", path_.string(), "': creating the temporary file '", temp_.string(),
                        "' in directory '", parent_dir(path_).string(), "' failed: ", std::strerror(err)));
  }
}

AtomicFile::~AtomicFile() { abort(); }

void AtomicFile::abort() noexcept {
  if (committed_) return;
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (!temp_.empty()) {
    ::unlink(temp_.c_str());
    temp_.clear();
  }
}

void AtomicFile::fail(const std::string& step, int err) {
  std::string temp = temp_.string();
  abort();
  bool existed = std::filesystem::exists(path_);
  throw Error(str_cat("cannot write '", path_.string(), "': ", step, " failed: ", std::strerror(err),
                      " (temporary file '", temp, "' removed; ",
                      existed ? "the previous file is unchanged)" : "nothing was written at the target)"));
}

void AtomicFile::write(const void* data, size_t n) {
  DEMI_CHECK(fd_ >= 0 && !committed_, "AtomicFile '", path_.string(), "': write after commit or abort");
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    size_t chunk = n;
    const WriteFaults* f = options_.faults;
    if (f && f->fail_after_bytes >= 0) {
      uint64_t room = written_ < static_cast<uint64_t>(f->fail_after_bytes) ? f->fail_after_bytes - written_ : 0;
      if (room == 0) fail(str_cat("writing byte ", written_, " of the temporary file"), ENOSPC);
      chunk = static_cast<size_t>(std::min<uint64_t>(chunk, room));
    }
    ssize_t got = ::write(fd_, p, chunk);
    if (got < 0) {
      if (errno == EINTR) continue;
      fail(str_cat("writing byte ", written_, " of the temporary file"), errno);
    }
    p += got;
    n -= static_cast<size_t>(got);
    written_ += static_cast<uint64_t>(got);
  }
}

void AtomicFile::commit() {
  DEMI_CHECK(fd_ >= 0 && !committed_, "AtomicFile '", path_.string(), "': commit after commit or abort");
  const WriteFaults* f = options_.faults;
  if (options_.sync) {
    if (f && f->fail_fsync) fail("fsync of the temporary file", EIO);
    if (::fsync(fd_) != 0) fail("fsync of the temporary file", errno);
  }
  int fd = fd_;
  fd_ = -1;
  // close() can report a delayed write error (NFS, quotas): it counts as a failed write.
  if (::close(fd) != 0) fail("closing the temporary file", errno);
  if (f && f->fail_rename) fail(str_cat("renaming the temporary file over '", path_.string(), "'"), EXDEV);
  if (::rename(temp_.c_str(), path_.c_str()) != 0) {
    fail(str_cat("renaming the temporary file over '", path_.string(), "'"), errno);
  }
  committed_ = true;
  temp_.clear();
  if (options_.sync) {
    int err = (f && f->fail_dir_fsync) ? EIO : fsync_dir(parent_dir(path_));
    // The new file is in place (readers see it complete) but its directory entry may not survive a
    // power loss; callers must not delete older checkpoints on the strength of it.
    if (err != 0) {
      throw Error(str_cat("wrote '", path_.string(), "' but fsync of its directory '", parent_dir(path_).string(),
                          "' failed: ", std::strerror(err), " (the file is complete but may not be durable)"));
    }
  }
}

void write_file_atomic(const std::filesystem::path& path, std::span<const uint8_t> bytes,
                       const AtomicWriteOptions& options) {
  AtomicFile f(path, options);
  f.write(bytes.data(), bytes.size());
  f.commit();
}

std::vector<uint8_t> read_file(const std::filesystem::path& path, uint64_t max_bytes) {
  // (O_NONBLOCK: opening a FIFO for reading would wait for a writer forever; it is refused below as not a
  // regular file, and a regular file reads the same either way.)
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int err = errno;
    throw Error(str_cat("cannot read '", path.string(), "': ", std::strerror(err)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw Error(str_cat("cannot read '", path.string(), "': ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(str_cat("cannot read '", path.string(), "': ",
                        S_ISDIR(st.st_mode) ? "is a directory, expected a file" : "not a regular file"));
  }
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    ::close(fd);
    throw Error(str_cat("cannot read '", path.string(), "': ", size, " bytes, more than the ", max_bytes,
                        " allowed"));
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  size_t got = 0;
  while (got < bytes.size()) {
    ssize_t r = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      int err = errno;
      ::close(fd);
      throw Error(str_cat("cannot read '", path.string(), "': read failed after ", got, " of ", size, " bytes: ",
                          r == 0 ? "the file shrank while being read" : std::strerror(err)));
    }
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  return bytes;
}

}  // namespace demi::io
