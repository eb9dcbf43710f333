/*
 * kp_pbjson: protobuf-c messages to JSON, and URL query strings to messages, driven by the
 * messages' descriptors alone, so that the analyzer's JSON HTTP API (analyzer/web.c,
 * docs/web-api.md) serves every view of analyzer/view.h without knowing one.
 *
 * JSON writer (the proto3 JSON mapping, with these choices):
 * - Field names are the .proto's (snake_case, as protobuf-c's descriptors hold them), not the
 *   mapping's lowerCamelCase: the names a user reads in proto/kprof.proto and kprofctl's --json.
 * - Every field is written, default values included (the mapping's "emit defaults" option), so
 *   a client never guesses a missing field: repeated fields as arrays (maybe empty), a message
 *   field that is absent as null. A proto3 `optional` scalar that is not set is null.
 * - int32, uint32, sint32, fixed32, sfixed32: JSON numbers. int64 and its kin: a JSON number
 *   when |v| <= 2^53 (a double holds it exactly, so JavaScript reads the same integer), else a
 *   decimal string ("9007199254740993"), as the mapping allows for every 64-bit integer.
 * - double and float: the shortest decimal that reads back to the same value (%.17g for
 *   doubles, %.9g for floats, trimmed), integers without ".0"; NaN, +Inf and -Inf as the
 *   strings "NaN", "Infinity" and "-Infinity".
 * - bool: true/false. string: through kp_json (valid UTF-8 copied, the rest escaped; the
 *   output is valid JSON whatever the bytes). bytes: standard base64 with padding.
 * - enum: the value's name ("OPS_GROUP_BY_NAME"); a value the descriptor does not know (a newer
 *   peer's) as its number.
 * - Nested messages as objects; maps are not used by kprof (a map field would come out as
 *   its array of entries).
 *
 * Query parser: "rank=0&group_by=OPS_GROUP_BY_NAME_AND_SHAPES&thresholds.late_pct=5" sets the
 * fields of a message by name ('.' goes into a message field, which is created). Names and
 * values are percent-decoded ('+' is a space). Values: integers in decimal (or 0x hex),
 * refused when out of the field's range; doubles and floats by strtod (finite only); bools as
 * true/false/1/0; enums by name or number (a number the enum does not have is refused);
 * strings as they are (UTF-8 only); bytes are not accepted. A repeated field takes a
 * comma-separated list ("ranks=0,1,3"); a scalar given twice is refused. An empty query sets
 * nothing. Every failure names the parameter and says what it takes.
 *
 * Errors: -ENOMEM, KP_ETOOBIG (the writer's strbuf limit), -EINVAL (a query the message
 * refuses, with the reason in err). Thread-safe: no state of their own.
 */
#ifndef KP_PBJSON_H
#define KP_PBJSON_H

#include <stdbool.h>
#include <stddef.h>

#include <protobuf-c/protobuf-c.h>

#include "kp_strbuf.h"

/* Longest parameter name or value the parser takes (bytes, decoded). */
#define KP_PBJSON_QUERY_VALUE_MAX 4096

/* Appends msg as one JSON object (no newline) to sb. Returns 0, -ENOMEM or KP_ETOOBIG (sb then
 * holds part of the object). */
int kp_pbjson_write(struct kp_strbuf *sb, const ProtobufCMessage *msg);

/* Appends v as the writer does an int64 field: a number when |v| <= 2^53, else a decimal
 * string (for JSON the API builds by hand, so that it follows the same rule). 0 or -ENOMEM. */
int kp_pbjson_write_i64(struct kp_strbuf *sb, int64_t v);

/*
 * Sets msg's fields (an initialized message whose memory the system allocator owns, so that
 * protobuf_c_message_free_unpacked frees it, with what this adds) from the query string
 * q[0..len) (without the '?'). Parameters named in reserved (a NULL-terminated list; NULL:
 * none) are refused as "set by the path". Returns 0, or -EINVAL with the reason in err (msg
 * may then hold some of the fields: free it), or -ENOMEM.
 */
int kp_pbjson_query(ProtobufCMessage *msg, const char *q, size_t len, const char *const *reserved,
                    char *err, size_t errlen);

/* Percent-decodes s[0..n) into out (at most cap-1 bytes and a NUL; '+' is a space). Returns
 * the decoded length, or -EINVAL for a bad escape ("%4", "%zz"), a NUL byte, or an output
 * longer than cap-1. */
long kp_pbjson_url_decode(const char *s, size_t n, char *out, size_t cap);

#endif
