// The wire's vocabulary: a peer's role and a worker's resources, as HELLO, SUBMIT, CAPACITY
// and the events carry them (SPEC.md §4.1). The codec, the broker and the allowlist include
// this header, never the SDK's: it is their one way to rlbus/role.hpp, where these types are
// defined once for the wire and the SDK both. to_string(role) and parse_role(), the roles'
// wire spellings, are defined in codec.cpp.
#pragma once

#include "rlbus/role.hpp"
