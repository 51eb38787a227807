/*
 * Linked into every kernel library einopt builds (TVM's LLVM output + this file, -Bsymbolic): the
 * error channel TVM's generated code reports through, kept in the library itself so that a kernel
 * library needs nothing from TVM at run time.
 *
 * A failed check in a kernel calls TVMFFIErrorSetRaisedFromCStrParts (a direct call) or the
 * __TVMFFIErrorSetRaisedFromCStr hook (which einopt_ort.c points at einopt_tvm_set_raised); the
 * caller then reads the message with einopt_tvm_last_error on the same thread.
 *
 * einopt_buffer_alignment says what the library's kernels assume of their buffers' addresses (bytes,
 * set when linking): einopt_ort.c runs them on a less aligned buffer through an aligned copy.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

#ifndef EINOPT_BUFFER_ALIGNMENT
#define EINOPT_BUFFER_ALIGNMENT 64
#endif

EXPORT const int32_t einopt_buffer_alignment = EINOPT_BUFFER_ALIGNMENT;

static _Thread_local char message[2048];

static void append(size_t *at, const char *text) {
    if (text == NULL)
        return;
    size_t n = strlen(text), room = sizeof message - 1 - *at;
    n = n < room ? n : room;
    memcpy(message + *at, text, n);
    *at += n;
    message[*at] = '\0';
}

EXPORT void TVMFFIErrorSetRaisedFromCStrParts(const char *kind, const char **parts, int32_t count) {
    size_t at = 0;
    message[0] = '\0';
    append(&at, kind);
    append(&at, ": ");
    for (int32_t i = 0; parts != NULL && i < count; i++)
        append(&at, parts[i]);
}

EXPORT void einopt_tvm_set_raised(const char *kind, const char *text) {
    const char *parts[1] = {text};
    TVMFFIErrorSetRaisedFromCStrParts(kind, parts, 1);
}

EXPORT const char *einopt_tvm_last_error(void) { return message[0] ? message : "unknown error"; }
