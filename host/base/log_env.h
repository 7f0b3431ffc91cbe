// How the logging variables read (host/base/debug.h): ZP_DEBUG, ZP_DEBUG_SUBSYS and ZP_DEBUG_FILE. A value they
// cannot take is not silently dropped: the reading says why, and the log's first lines repeat it once.
#pragma once

#include <cstdio>
#include <string>

namespace zp {

// ZP_DEBUG's level (a LogLevel) from its text, nullptr when unset: NONE, VERSION, WARN, INFO or TRACE in any case;
// WARN when unset or empty, and for any other text, with *warning saying so ("" otherwise).
int readLogLevel(const char* text, std::string* warning);
// ZP_DEBUG_SUBSYS's mask from its text (comma-separated INIT, COLL, QUANT, TOPO, ALLOC, ENV, ALL in any case; a
// leading ^ inverts): the words it knows; *warning names the others ("" when there are none).
unsigned readLogSubsys(const char* text, std::string* warning);
// The file ZP_DEBUG_FILE's pattern names (%h the hostname, %p the pid), opened for writing; nullptr with *warning
// saying why when it cannot be opened (the log stays on stderr).
FILE* openLogFile(const char* pattern, std::string* warning);

}  // namespace zp
