// Protocol v1 constants: the header frame, message type ids and their names, error codes and
// their names and the decode limits come from the wire's list (messages.json, made into the
// generated codec/model.hpp); the field limits are in codec/rules.hpp.
#pragma once

#include "codec/model.hpp"
#include "codec/rules.hpp"
