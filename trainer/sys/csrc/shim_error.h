// The shims' one error convention: every entry point catches every C++ exception and returns it
// as a heap C string (NULL means success), which Rust turns into an error and frees with
// tc_free_error (defined once, in c10d_shim.cpp). See trainer/sys/src/error.rs.
#pragma once

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include <c10/util/Exception.h>

namespace tessera_shim {

// `msg` in a malloc'd NUL-terminated copy (NULL only if malloc fails).
inline char* dup_message(const std::string& msg) {
  char* out = static_cast<char*>(std::malloc(msg.size() + 1));
  if (out != nullptr) {
    std::memcpy(out, msg.c_str(), msg.size() + 1);
  }
  return out;
}

// Runs `body`; any exception becomes an owned error string, success is NULL.
template <typename F>
char* guarded(F body) {
  try {
    body();
    return nullptr;
  } catch (const c10::Error& e) {
    return dup_message(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return dup_message(e.what());
  } catch (...) {
    return dup_message("unknown C++ exception");
  }
}

}  // namespace tessera_shim
