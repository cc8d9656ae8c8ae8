"""The tokenizer's first pass in C: GPT-2's pre-tokenization, the piece cache's lookups and BPE's
merges, one call a text (`Merger.encode`), exactly as `core`'s Python (`_pretokenize`, `_PieceCache`,
`Tokenizer._bpe`), which stays the readable reference the tests diff against.

Python's per-piece work (a heap over a linked list of bytes objects) made the first pass over new
text 3x slower than tiktoken's; in C the merges of a piece run on token ids in a table of pairs
(left id, right id) -> (rank, merged id), lowest rank first, leftmost on a tie: `_bpe`'s rule.
Short pieces, most of them, rescan their pairs after each merge (tiktoken's way, fastest when a
piece is a few bytes); long ones keep `_bpe`'s heap, so a piece of n bytes costs O(n log n).
The pre-tokenizer scans the text for the pattern's alternatives by hand, each character's class
(letter, number, white space, other) read from a table that the `regex` module itself fills in
from GPT2_PATTERN's classes (`\\p{L}`, `\\p{N}`, `\\s`), so that the two split text alike. (Merges
alone in C were not enough: on mixed code and languages the `regex` module's split by itself ran
at 17 MB/s, tiktoken's whole encode at 15 MB/s, on this project's 2-core machine.)

It is a small CPython extension, no torch (the tokenizer is the torch-free base), compiled once
by the system's C compiler ($CC, else Python's own, else cc) in about a second, at set-up with
`python -m gpt2.tokenizer.native` or else at first use, and kept in a directory of its own under
gpt2's cache ($GPT2_CACHE, else $XDG_CACHE_HOME/gpt2, else ~/.cache/gpt2; a process with a
$GPT2_CACHE of its own also loads the default cache's build), named by a hash of everything that
makes one build unfit for another process (the source, the flags, the Python, the compiler), as
the decode kernel's (`gpt2.generation.kernels`). Where it cannot be built (no
compiler, no headers) `merger` returns None, remembered (`failure()` says why), and the tokenizer
encodes in Python, as exactly and 5-8x slower on new text; set GPT2_BPE_KERNEL=0 to turn it off.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import regex

from gpt2._files import atomic_path
from gpt2.errors import GPT2Error

_SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { OTHER = 0, LETTER = 1, NUMBER = 2, SPACE = 3 };  /* a character's class, as GPT2_PATTERN sees it */
#define NO_RANK INT32_MAX
#define EMPTY UINT64_MAX
#define SMALL 64  /* pieces of up to this many bytes rescan their pairs; longer ones keep a heap */

typedef struct { uint64_t key; int32_t rank, merged; } Slot;  /* key: left id << 32 | right id */

typedef struct {
  PyObject_HEAD
  Slot *slots;  /* open addressing, linear probing, at most half full */
  uint64_t mask;
  int shift;
  int32_t byte_ids[256];
  PyObject **ints;  /* the int of each id, shared by every tuple and list that holds it (as core's encoder's) */
  Py_ssize_t n_ints;
  PyObject *classes;  /* bytes: the class of each code point, 0x110000 of them */
  const uint8_t *cls;
  PyObject *utf8;  /* piece -> bytes, for a piece with a lone surrogate (core._utf8) */
} Merger;

static inline const Slot *find(const Merger *m, int32_t a, int32_t b) {
  const uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
  uint64_t i = (key * 0x9E3779B97F4A7C15ull) >> m->shift;
  for (;;) {
    const Slot *s = &m->slots[i];
    if (s->key == key) return s;
    if (s->key == EMPTY) return NULL;
    i = (i + 1) & m->mask;
  }
}

static inline int32_t rank_of(const Merger *m, int32_t a, int32_t b, int32_t *merged) {
  const Slot *s = find(m, a, b);
  if (s == NULL) return NO_RANK;
  *merged = s->merged;
  return s->rank;
}

/* Merge ids[0..n) in place, lowest rank first, leftmost on a tie; returns how many are left.
   Few bytes: find the lowest pair by a scan, merge it, update its neighbours' ranks. */
static Py_ssize_t merge_small(const Merger *m, int32_t *ids, Py_ssize_t n) {
  int32_t rank[SMALL], merged[SMALL];
  for (Py_ssize_t k = 0; k + 1 < n; k++) rank[k] = rank_of(m, ids[k], ids[k + 1], &merged[k]);
  while (n > 1) {
    int32_t best = NO_RANK;
    Py_ssize_t b = -1;
    for (Py_ssize_t k = 0; k + 1 < n; k++)
      if (rank[k] < best) { best = rank[k]; b = k; }
    if (b < 0) break;
    ids[b] = merged[b];
    memmove(ids + b + 1, ids + b + 2, (size_t)(n - b - 2) * sizeof *ids);
    if (n - b - 3 > 0) {
      memmove(rank + b + 1, rank + b + 2, (size_t)(n - b - 3) * sizeof *rank);
      memmove(merged + b + 1, merged + b + 2, (size_t)(n - b - 3) * sizeof *merged);
    }
    n--;
    if (b + 1 < n) rank[b] = rank_of(m, ids[b], ids[b + 1], &merged[b]);
    if (b > 0) rank[b - 1] = rank_of(m, ids[b - 1], ids[b], &merged[b - 1]);
  }
  return n;
}

static void heap_push(uint64_t *heap, Py_ssize_t *size, uint64_t v) {
  Py_ssize_t i = (*size)++;
  while (i > 0) {
    Py_ssize_t p = (i - 1) / 2;
    if (heap[p] <= v) break;
    heap[i] = heap[p];
    i = p;
  }
  heap[i] = v;
}

static uint64_t heap_pop(uint64_t *heap, Py_ssize_t *size) {
  uint64_t top = heap[0], v = heap[--(*size)];
  Py_ssize_t i = 0, n = *size;
  for (;;) {
    Py_ssize_t c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && heap[c + 1] < heap[c]) c++;
    if (v <= heap[c]) break;
    heap[i] = heap[c];
    i = c;
  }
  if (n > 0) heap[i] = v;
  return top;
}

/* Many bytes: core's _bpe in C. A linked list over byte positions, a heap of (rank, position) of
   each mergeable pair (equal ranks pop leftmost first); a popped pair whose sides have changed is
   stale and skipped. Each merge pushes at most two pairs, so the heap holds fewer than 3n. */
static Py_ssize_t merge_large(const Merger *m, int32_t *ids, Py_ssize_t n) {
  Py_ssize_t *next = PyMem_Malloc(2 * n * sizeof(Py_ssize_t));
  uint64_t *heap = PyMem_Malloc(3 * n * sizeof(uint64_t));
  if (next == NULL || heap == NULL) {
    PyMem_Free(next);
    PyMem_Free(heap);
    PyErr_NoMemory();
    return -1;
  }
  Py_ssize_t *prev = next + n, size = 0;
  int32_t merged;
  for (Py_ssize_t i = 0; i < n; i++) {
    next[i] = i + 1;
    prev[i] = i - 1;
    if (i + 1 < n) {
      int32_t r = rank_of(m, ids[i], ids[i + 1], &merged);
      if (r != NO_RANK) heap_push(heap, &size, (uint64_t)r << 32 | (uint64_t)i);
    }
  }
  while (size > 0) {
    uint64_t top = heap_pop(heap, &size);
    Py_ssize_t i = (Py_ssize_t)(top & 0xFFFFFFFFu), j = next[i];
    if (ids[i] < 0 || j == n || rank_of(m, ids[i], ids[j], &merged) != (int32_t)(top >> 32)) continue;
    ids[i] = merged;
    ids[j] = -1;
    Py_ssize_t k = next[i] = next[j];
    if (k < n) {
      prev[k] = i;
      int32_t r = rank_of(m, ids[i], ids[k], &merged);
      if (r != NO_RANK) heap_push(heap, &size, (uint64_t)r << 32 | (uint64_t)i);
    }
    Py_ssize_t h = prev[i];
    if (h >= 0) {
      int32_t r = rank_of(m, ids[h], ids[i], &merged);
      if (r != NO_RANK) heap_push(heap, &size, (uint64_t)r << 32 | (uint64_t)h);
    }
  }
  Py_ssize_t out = 0;
  for (Py_ssize_t i = 0; i < n; i = next[i]) ids[out++] = ids[i];
  PyMem_Free(next);
  PyMem_Free(heap);
  return out;
}

/* The token ids of a piece's UTF-8 bytes, as a new tuple (or appended to `out` where it is not NULL). */
static PyObject *bpe_bytes(const Merger *m, const uint8_t *data, Py_ssize_t n, PyObject *out) {
  if ((uint64_t)n > 0xFFFFFFFFu) {  /* the heap keeps positions in 32 bits */
    PyErr_SetString(PyExc_OverflowError, "a piece of over 4 GB");
    return NULL;
  }
  int32_t small[SMALL];
  int32_t *ids = n <= SMALL ? small : PyMem_Malloc(n * sizeof(int32_t));
  if (ids == NULL) return PyErr_NoMemory();
  for (Py_ssize_t k = 0; k < n; k++) ids[k] = m->byte_ids[data[k]];
  Py_ssize_t left = n <= SMALL ? merge_small(m, ids, n) : merge_large(m, ids, n);
  PyObject *result = NULL;
  if (left >= 0 && out != NULL) {
    result = out;
    for (Py_ssize_t k = 0; k < left && result != NULL; k++)
      if (PyList_Append(out, m->ints[ids[k]]) < 0) result = NULL;
  } else if (left >= 0 && (result = PyTuple_New(left)) != NULL) {
    for (Py_ssize_t k = 0; k < left; k++) {
      Py_INCREF(m->ints[ids[k]]);
      PyTuple_SET_ITEM(result, k, m->ints[ids[k]]);
    }
  }
  if (ids != small) PyMem_Free(ids);
  return result;
}

#define READ(i) PyUnicode_READ(kind, data, (i))
#if PY_VERSION_HEX < 0x030C0000
#define READY(text) (PyUnicode_READY(text) < 0)  /* a str made by the legacy API, before 3.12 */
#else
#define READY(text) 0
#endif

/* The end of the piece that starts at i: GPT2_PATTERN's alternatives, tried in its order,
   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static inline Py_ssize_t piece_end(const uint8_t *cls, int kind, const void *data, Py_ssize_t n, Py_ssize_t i) {
  const Py_UCS4 c = READ(i);
  if (c == '\'' && i + 1 < n) {
    const Py_UCS4 d = READ(i + 1);
    if (d == 's' || d == 't' || d == 'm' || d == 'd') return i + 2;
    if (i + 2 < n && READ(i + 2) == (d == 'l' ? 'l' : 'e') && (d == 'r' || d == 'v' || d == 'l')) return i + 3;
  }
  Py_ssize_t p = i;
  int k = cls[c];
  if (c == ' ' && i + 1 < n && cls[READ(i + 1)] != SPACE) { p = i + 1; k = cls[READ(p)]; }
  Py_ssize_t j = p + 1;
  if (k != SPACE) {  /* a run of letters, of numbers or of others, after an optional space */
    while (j < n && cls[READ(j)] == k) j++;
    return j;
  }
  while (j < n && cls[READ(j)] == SPACE) j++;
  return j < n && j - i >= 2 ? j - 1 : j;  /* \s+(?!\S) leaves the last space to the word after */
}

/* UTF-8 of text[a:b) into buf (4 bytes a character); -1 where it holds a lone surrogate. */
static inline Py_ssize_t to_utf8(int kind, const void *data, Py_ssize_t a, Py_ssize_t b, uint8_t *buf) {
  Py_ssize_t o = 0;
  for (Py_ssize_t i = a; i < b; i++) {
    const Py_UCS4 c = READ(i);
    if (c < 0x80) buf[o++] = (uint8_t)c;
    else if (c < 0x800) { buf[o++] = 0xC0 | (c >> 6); buf[o++] = 0x80 | (c & 0x3F); }
    else if (c < 0x10000) {
      if (c >= 0xD800 && c <= 0xDFFF) return -1;
      buf[o++] = 0xE0 | (c >> 12); buf[o++] = 0x80 | ((c >> 6) & 0x3F); buf[o++] = 0x80 | (c & 0x3F);
    } else {
      buf[o++] = 0xF0 | (c >> 18); buf[o++] = 0x80 | ((c >> 12) & 0x3F);
      buf[o++] = 0x80 | ((c >> 6) & 0x3F); buf[o++] = 0x80 | (c & 0x3F);
    }
  }
  return o;
}

/* The ids of text[a:b) (a new tuple, or appended to `out`); `piece` is its str where one is at hand. */
static PyObject *piece_ids(Merger *m, PyObject *text, int kind, const void *data, Py_ssize_t a, Py_ssize_t b,
                           PyObject *piece, PyObject *out) {
  uint8_t small[4 * SMALL];
  uint8_t *buf = 4 * (b - a) <= (Py_ssize_t)sizeof small ? small : PyMem_Malloc(4 * (b - a));
  if (buf == NULL) return PyErr_NoMemory();
  PyObject *result = NULL;
  Py_ssize_t n = to_utf8(kind, data, a, b, buf);
  if (n >= 0) {
    result = bpe_bytes(m, buf, n, out);
  } else {  /* a lone surrogate: core._utf8 says which bytes stand for it */
    PyObject *owned = piece == NULL ? PyUnicode_Substring(text, a, b) : NULL;
    PyObject *bytes = owned || piece ? PyObject_CallOneArg(m->utf8, piece ? piece : owned) : NULL;
    if (bytes != NULL && !PyBytes_Check(bytes)) PyErr_SetString(PyExc_TypeError, "utf8() must return bytes");
    else if (bytes != NULL)
      result = bpe_bytes(m, (const uint8_t *)PyBytes_AS_STRING(bytes), PyBytes_GET_SIZE(bytes), out);
    Py_XDECREF(bytes);
    Py_XDECREF(owned);
  }
  if (buf != small) PyMem_Free(buf);
  return result;
}

static int extend(PyObject *out, PyObject *ids) {
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(ids); k++)
    if (PyList_Append(out, PyTuple_GET_ITEM(ids, k)) < 0) return -1;
  return 0;
}

/* The piece cache and its bounds, _PieceCache's: pieces over max_chars are not cached, and a cache
   of max_entries is emptied before it takes one more. */
typedef struct { PyObject *dict; Py_ssize_t max_chars, max_entries; } Cache;

/* A piece's ids onto `out`: from the cache, else merged and (if short enough) cached. */
static int encode_piece(Merger *m, PyObject *text, int kind, const void *data, Py_ssize_t a, Py_ssize_t b,
                        const Cache *cache, PyObject *out) {
  if (b - a > cache->max_chars) return piece_ids(m, text, kind, data, a, b, NULL, out) ? 0 : -1;
  PyObject *piece = PyUnicode_Substring(text, a, b);
  if (piece == NULL) return -1;
  int status = -1;
  PyObject *ids = PyDict_GetItemWithError(cache->dict, piece);  /* borrowed */
  if (ids != NULL) {
    status = PyTuple_Check(ids) ? extend(out, ids) : (PyErr_SetString(PyExc_TypeError, "cache values are tuples"), -1);
  } else if (!PyErr_Occurred() && (ids = piece_ids(m, text, kind, data, a, b, piece, NULL)) != NULL) {
    if (PyDict_GET_SIZE(cache->dict) >= cache->max_entries) PyDict_Clear(cache->dict);
    status = PyDict_SetItem(cache->dict, piece, ids) < 0 ? -1 : extend(out, ids);
    Py_DECREF(ids);
  }
  Py_DECREF(piece);
  return status;
}

/* BODY for each piece text[a:b), the text's characters read as KIND: one loop for each width. */
#define SCAN(KIND, BODY) { const int kind = KIND; Py_ssize_t a = 0; \
  while (a < n) { Py_ssize_t b = piece_end(m->cls, kind, data, n, a); BODY; a = b; } }
#define SCAN_KINDS(BODY) switch (PyUnicode_KIND(text)) { \
  case PyUnicode_1BYTE_KIND: SCAN(PyUnicode_1BYTE_KIND, BODY) break; \
  case PyUnicode_2BYTE_KIND: SCAN(PyUnicode_2BYTE_KIND, BODY) break; \
  default: SCAN(PyUnicode_4BYTE_KIND, BODY) break; }

static PyObject *Merger_encode(Merger *m, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 4 || !PyUnicode_Check(args[0]) || !PyDict_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "encode(text: str, cache: dict, max_piece_chars: int, max_entries: int)");
    return NULL;
  }
  const Cache cache = {args[1], PyLong_AsSsize_t(args[2]), PyLong_AsSsize_t(args[3])};
  if (PyErr_Occurred() || READY(args[0])) return NULL;
  PyObject *text = args[0], *out = PyList_New(0);
  if (out == NULL) return NULL;
  const Py_ssize_t n = PyUnicode_GET_LENGTH(text);
  const void *data = PyUnicode_DATA(text);
  SCAN_KINDS(if (encode_piece(m, text, kind, data, a, b, &cache, out) < 0) { Py_DECREF(out); return NULL; })
  return out;
}

static PyObject *Merger_pieces(Merger *m, PyObject *text) {
  if (!PyUnicode_Check(text)) { PyErr_SetString(PyExc_TypeError, "pieces(text: str)"); return NULL; }
  if (READY(text)) return NULL;
  PyObject *out = PyList_New(0), *piece;
  if (out == NULL) return NULL;
  const Py_ssize_t n = PyUnicode_GET_LENGTH(text);
  const void *data = PyUnicode_DATA(text);
  SCAN_KINDS(if ((piece = PyUnicode_Substring(text, a, b)) == NULL || PyList_Append(out, piece) < 0) {
    Py_XDECREF(piece); Py_DECREF(out); return NULL; } Py_DECREF(piece);)
  return out;
}

static PyObject *Merger_bpe(Merger *m, PyObject *piece) {
  if (!PyBytes_Check(piece)) { PyErr_SetString(PyExc_TypeError, "bpe(piece: bytes)"); return NULL; }
  return bpe_bytes(m, (const uint8_t *)PyBytes_AS_STRING(piece), PyBytes_GET_SIZE(piece), NULL);
}

/* Merger(pairs, byte_ids, classes, utf8): pairs holds int32 triples
   (left id, right id, merged id), merge k at index k; byte_ids 256 int32; classes a byte a code point. */
static PyObject *Merger_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
  Py_buffer pairs, bytes_ids;
  PyObject *classes, *utf8;
  if (!PyArg_ParseTuple(args, "y*y*SO", &pairs, &bytes_ids, &classes, &utf8))
    return NULL;
  Merger *m = NULL;
  Py_ssize_t count = pairs.len / (3 * (Py_ssize_t)sizeof(int32_t));
  if (pairs.len % (3 * sizeof(int32_t)) || bytes_ids.len != 256 * sizeof(int32_t) ||
      PyBytes_GET_SIZE(classes) != 0x110000 || !PyCallable_Check(utf8)) {
    PyErr_SetString(PyExc_ValueError, "Merger: malformed tables");
    goto done;
  }
  if ((m = (Merger *)type->tp_alloc(type, 0)) == NULL) goto done;
  int bits = 4;
  while (((Py_ssize_t)1 << bits) < 2 * count + 2) bits++;
  m->shift = 64 - bits;
  m->mask = ((uint64_t)1 << bits) - 1;
  if ((m->slots = PyMem_Malloc(sizeof(Slot) << bits)) == NULL) { Py_CLEAR(m); PyErr_NoMemory(); goto done; }
  for (uint64_t i = 0; i <= m->mask; i++) m->slots[i].key = EMPTY;
  const int32_t *p = pairs.buf;
  for (Py_ssize_t r = 0; r < count; r++, p += 3) {
    const uint64_t key = ((uint64_t)(uint32_t)p[0] << 32) | (uint32_t)p[1];
    uint64_t i = (key * 0x9E3779B97F4A7C15ull) >> m->shift;
    while (m->slots[i].key != EMPTY && m->slots[i].key != key) i = (i + 1) & m->mask;
    if (m->slots[i].key == EMPTY) m->slots[i] = (Slot){key, (int32_t)r, p[2]};  /* a repeat keeps its first rank */
  }
  memcpy(m->byte_ids, bytes_ids.buf, sizeof m->byte_ids);
  int32_t top = 0, low = 0;  /* the largest id (the ints made are 0..top), the smallest (never negative) */
  for (int b = 0; b < 256; b++) {
    top = m->byte_ids[b] > top ? m->byte_ids[b] : top;
    low = m->byte_ids[b] < low ? m->byte_ids[b] : low;
  }
  for (Py_ssize_t k = 0; k < 3 * count; k++) {
    const int32_t id = ((const int32_t *)pairs.buf)[k];
    top = k % 3 == 2 && id > top ? id : top;  /* only bytes and merges' results are ever held */
    low = id < low ? id : low;
  }
  if (low < 0) { Py_CLEAR(m); PyErr_SetString(PyExc_ValueError, "Merger: a negative token id"); goto done; }
  if ((m->ints = PyMem_Calloc(top + 1, sizeof(PyObject *))) == NULL) { Py_CLEAR(m); PyErr_NoMemory(); goto done; }
  m->n_ints = top + 1;
  for (Py_ssize_t i = 0; i <= top; i++)
    if ((m->ints[i] = PyLong_FromSsize_t(i)) == NULL) { Py_CLEAR(m); goto done; }
  Py_INCREF(classes);
  m->classes = classes;
  m->cls = (const uint8_t *)PyBytes_AS_STRING(classes);
  Py_INCREF(utf8);
  m->utf8 = utf8;
done:
  PyBuffer_Release(&pairs);
  PyBuffer_Release(&bytes_ids);
  return (PyObject *)m;
}

static void Merger_dealloc(Merger *m) {
  for (Py_ssize_t i = 0; i < m->n_ints; i++) Py_XDECREF(m->ints[i]);
  PyMem_Free(m->ints);
  PyMem_Free(m->slots);
  Py_XDECREF(m->classes);
  Py_XDECREF(m->utf8);
  Py_TYPE(m)->tp_free((PyObject *)m);
}

static PyMethodDef Merger_methods[] = {
  {"encode", (PyCFunction)(void (*)(void))Merger_encode, METH_FASTCALL,
   "encode(text, cache, max_piece_chars, max_entries) -> list of ids: pre-tokenized, each piece's ids from "
   "the cache or merged (and cached, as _PieceCache caches)"},
  {"pieces", (PyCFunction)Merger_pieces, METH_O, "pieces(text) -> list of str: GPT2_PATTERN's pieces"},
  {"bpe", (PyCFunction)Merger_bpe, METH_O, "bpe(piece_bytes) -> tuple of ids: the merges of one piece"},
  {NULL, NULL, 0, NULL},
};

static PyTypeObject MergerType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "gpt2_bpe.Merger",
  .tp_basicsize = sizeof(Merger),
  .tp_flags = Py_TPFLAGS_DEFAULT,
  .tp_doc = "GPT-2's pre-tokenization and BPE merges over one vocabulary's tables",
  .tp_new = Merger_new,
  .tp_dealloc = (destructor)Merger_dealloc,
  .tp_methods = Merger_methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "gpt2_bpe", NULL, -1, NULL};

PyMODINIT_FUNC PyInit_gpt2_bpe(void) {
  if (PyType_Ready(&MergerType) < 0) return NULL;
  PyObject *m = PyModule_Create(&module);
  if (m != NULL && PyModule_AddObjectRef(m, "Merger", (PyObject *)&MergerType) < 0) Py_CLEAR(m);
  return m;
}
"""

_NAME = "gpt2_bpe"  # the module's name, which its file and its init function carry
# Portable code (no -march=native): a cache directory may be shared by machines with other CPUs.
_CFLAGS = ("-O3", "-fPIC", "-fno-strict-aliasing", "-DNDEBUG")
_LDFLAGS = ("-bundle", "-undefined", "dynamic_lookup") if sys.platform == "darwin" else ("-shared",)
_BUILD_LIMIT = 120  # seconds: a build holding the lock for longer is stuck; compile without waiting

_lock = threading.Lock()
_module: ModuleType | None = None
_failure: str | None = None  # why the kernel is unavailable, once it is known to be


def enabled() -> bool:
    """Whether the kernel may be used at all (GPT2_BPE_KERNEL=0 turns it off)."""
    return os.environ.get("GPT2_BPE_KERNEL", "1") != "0"


def merger(
    encoder: Mapping[bytes, int], merges: Sequence[tuple[bytes, bytes]], utf8: Callable[[str], bytes]
) -> Any | None:
    """A `Merger` over this vocabulary, None where the kernel is off or cannot be had. Its
    `encode(text, cache, max_piece_chars, max_entries) -> ids` is core's `_encode_ordinary`, the
    cache (a dict: piece -> tuple of ids) filled as `_PieceCache` fills itself, pieces over
    `max_piece_chars` uncached, emptied when it holds `max_entries`; `bpe(piece bytes) -> ids` is
    `_bpe`, `pieces(text)` is `_pretokenize`. `utf8` gives the bytes of a piece with a lone
    surrogate (core's `_utf8`). The tables are built from the vocabulary in each process, never pickled."""
    module = extension()
    classes = character_classes() if module is not None else None
    if classes is None:
        return None
    pairs = array("i")  # (left id, right id, merged id) for merge k at index k
    for left, right in merges:
        pairs.extend((encoder[left], encoder[right], encoder[left + right]))
    byte_ids = array("i", (encoder[bytes([b])] for b in range(256)))
    return module.Merger(pairs, byte_ids, classes, utf8)


_CLASSES = ((1, r"\p{L}+"), (2, r"\p{N}+"), (3, r"\s+"))


@functools.lru_cache(maxsize=1)
def character_classes() -> bytes | None:
    """Each code point's class as GPT2_PATTERN reads it: 1 for \\p{L}, 2 for \\p{N}, 3 for \\s, 0 for
    any other, as the `regex` module (the pattern's engine) finds them among all 0x110000 code points.
    None (the kernel unused) if two classes ever shared a code point, which the scanner assumes they never do.
    Kept beside the build, named by the `regex` module's version (its Unicode tables): finding them takes a
    process 0.15 s, reading them back 1 ms."""
    kept = [d / f"classes_{_classes_key()}.bin" for d in cache_dirs()]
    for path in kept:
        with contextlib.suppress(OSError):
            if len(data := path.read_bytes()) == 0x110000:
                return data
    classes = _find_classes()
    if classes is not None:
        with contextlib.suppress(GPT2Error, OSError):  # a cache that cannot be written: found again next time
            kept[0].parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(kept[0]) as tmp:
                tmp.write_bytes(classes)
    return classes


def _classes_key() -> str:
    parts = [regex.__version__, *(pattern for _, pattern in _CLASSES)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _find_classes() -> bytes | None:
    global _failure
    every = (
        array("I", range(0x110000))
        .tobytes()
        .decode("utf-32-le" if sys.byteorder == "little" else "utf-32-be", "surrogatepass")
    )
    classes = bytearray(len(every))
    for code, pattern in _CLASSES:
        for match in regex.finditer(pattern, every):
            start, end = match.span()
            if classes[start:end].count(0) != end - start:
                _failure = f"the regex module's {pattern} overlaps another class at U+{start:04X}"
                return None
            classes[start:end] = bytes([code]) * (end - start)
    return bytes(classes)


# ------------------------------------------------------------------ the build


def _compiler() -> list[str]:
    """The C compiler's command: $CC, else the one Python was built with, else cc."""
    return shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")


def _compiler_identity(command: list[str]) -> str:
    """Where the compiler is and which file it is (size, time), without running it: a new compiler,
    a new key. A missing one gives a key of its own, whose build fails."""
    path = shutil.which(command[0]) if command else None
    if path is None:
        return f"missing {command}"
    real = os.path.realpath(path)
    stat = os.stat(real)
    return f"{command} {real} {stat.st_size} {stat.st_mtime_ns}"


def cache_key() -> str:
    """A hash of everything that makes a build unfit for another process to load."""
    compiler = _compiler()
    parts = [
        _SOURCE,
        *_CFLAGS,
        *_LDFLAGS,
        sys.version,
        sys.implementation.cache_tag,
        sysconfig.get_config_var("EXT_SUFFIX") or "",
        sysconfig.get_paths()["include"],
        platform.machine(),
        _compiler_identity(compiler),
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def cache_dirs() -> list[Path]:
    """Where this environment's build is looked for, bpe_<cache key> in kernels/ under gpt2's cache:
    $GPT2_CACHE where it is set, then the default one ($XDG_CACHE_HOME/gpt2, else ~/.cache/gpt2),
    so that a process pointed at a cache of its own still finds the build that set-up made.
    A build goes into the first."""
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpt2"
    roots = [Path(os.environ["GPT2_CACHE"]), default] if os.environ.get("GPT2_CACHE") else [default]
    name = f"bpe_{cache_key()}"
    return [root / "kernels" / name for root in roots]


def _built() -> Path | None:
    """The library already built for this environment, if any."""
    return next((library for d in cache_dirs() if (library := _library(d)).exists()), None)


def _library(directory: Path) -> Path:
    return directory / f"{_NAME}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"


def _import(library: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(_NAME, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load_or_build() -> ModuleType:
    if (built := _built()) is not None:  # built before, by any process of an environment like this one
        return _import(built)
    directory = cache_dirs()[0]
    library = _library(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with _build_lock(directory / "lock"):
        if library.exists():  # built by the process we waited for
            return _import(library)
        _build(directory, library)
    return _import(library)


def _build(directory: Path, library: Path) -> None:
    """Compile in a directory of this build's own, then rename the library into place: a build
    killed midway leaves no library, and two builds never write the same file."""
    for old in directory.glob("build-*"):  # left by builds that were killed
        if time.time() - old.stat().st_mtime > _BUILD_LIMIT:
            shutil.rmtree(old, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=directory))
    try:
        source, target = work / f"{_NAME}.c", work / library.name
        source.write_text(_SOURCE)
        include = sysconfig.get_paths()["include"]
        command = [*_compiler(), *_CFLAGS, f"-I{include}", str(source), "-o", str(target), *_LDFLAGS]
        done = subprocess.run(command, capture_output=True, text=True, timeout=_BUILD_LIMIT)
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if "error" in line] or done.stderr.splitlines()
            raise RuntimeError(f"{command[0]} failed: {(lines or ['no message'])[0].strip()}")
        os.replace(target, library)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def _build_lock(path: Path) -> Iterator[None]:
    """Held while one process builds, so that processes starting together build once: an flock,
    released by the system however its holder ends. A holder past _BUILD_LIMIT is stuck, and this
    process compiles without it (builds never collide: each has its own directory)."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): build without
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        deadline = time.monotonic() + _BUILD_LIMIT
        while time.monotonic() < deadline:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock, if held


def extension() -> ModuleType | None:
    """The compiled module, loaded or built on first use; None (remembered, with `failure()` saying
    why) where it is turned off or cannot be built: the tokenizer then encodes in Python."""
    global _module, _failure
    if _module is not None or _failure is not None:
        return _module
    with _lock:
        if _module is None and _failure is None and not enabled():
            _failure = "turned off (GPT2_BPE_KERNEL=0)"
        if _module is None and _failure is None:
            try:
                _module = _load_or_build()
            except Exception as e:  # no compiler, no headers, a failed build: encode in Python
                _failure = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
    return _module


def failure() -> str | None:
    """Why the kernel is unavailable (None while it is available or not yet tried)."""
    return _failure


def main() -> int:
    """`python -m gpt2.tokenizer.native`: have the kernel ready now, at set-up, not at first use."""
    if not enabled():
        print("tokenizer kernel: turned off (GPT2_BPE_KERNEL=0)")
        return 0
    built = _built()
    started = time.monotonic()
    module = extension()
    if module is not None:
        character_classes()  # found and kept beside the build, for every later process
    if module is None:
        print(f"tokenizer kernel: not available here ({_failure}); encoding runs in Python (slower, as exact)")
    elif built:
        print(f"tokenizer kernel: ready ({Path(module.__file__).parent})")
    else:
        print(f"tokenizer kernel: compiled in {time.monotonic() - started:.1f} s ({Path(module.__file__).parent})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
