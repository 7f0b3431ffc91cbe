// Memory that an exchange which failed was given, and that its engine (a transport, MPI) may still use: a collective
// it cannot cancel. Kept for the life of the process, never freed nor reused, and still reachable (leak checkers stay
// quiet).
#pragma once

#include <mutex>
#include <vector>

namespace zp {

// Moves *memory where nothing frees it, and leaves *memory empty.
template <class T>
void keepForGood(std::vector<T>* memory) {
  static std::mutex mutex;
  static auto* kept = new std::vector<std::vector<T>>();
  std::lock_guard<std::mutex> lock(mutex);
  if (!memory->empty()) kept->push_back(std::move(*memory));
  *memory = std::vector<T>();
}

}  // namespace zp
