/*
 * identify.c -- say what a file is when it is not a snapshot pickle, so
 * that a wrong input gets "this is a zip archive written by torch.save"
 * instead of an opcode-level error.
 *
 * msnap__identify_head looks at the first bytes (after decompression):
 * formats with an unambiguous magic number are recognised before any
 * parsing (zip, legacy torch.save, xz, bzip2, lz4, ELF, PNG, PDF, HTML,
 * SVG/XML, JSON).  Text is recognised only after the pickle reader failed
 * early (msnap__identify_text), because protocol-0 pickles are text too.
 * gzip and zstd never get here: the source decompresses them.
 */
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "model/pickle.h"

static bool starts(const unsigned char *p, size_t n, const char *magic,
                   size_t m) {
  return n >= m && memcmp(p, magic, m) == 0;
}

/* Case-insensitive prefix after leading whitespace. */
static bool starts_ci(const unsigned char *p, size_t n, const char *word) {
  size_t i = 0, m = strlen(word);
  while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\r' ||
                   p[i] == '\n'))
    i++;
  return n - i >= m && strncasecmp((const char *)p + i, word, m) == 0;
}

/*
 * A description of the bytes p[0..n) ("this is a zip archive ..."), or
 * false when they may be a pickle.  *at gets the offset the description
 * refers to (the first non-blank byte for JSON).
 */
bool msnap__identify_head(const unsigned char *p, size_t n, char *out,
                          size_t len, size_t *at) {
  *at = 0;
  static const unsigned char torch_magic[] = {
      0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8,
      0x50, 0x19};
  const char *what = NULL;
  if (starts(p, n, "PK\x03\x04", 4) || starts(p, n, "PK\x05\x06", 4))
    what = "this is a zip archive (torch.save writes zip files: load it "
           "with torch.load, then write the snapshot with "
           "torch.cuda.memory._dump_snapshot or pickle.dump)";
  else if (starts(p, n, (const char *)torch_magic, sizeof torch_magic))
    what = "this is a torch.save file (the legacy format: its first "
           "pickle is torch's magic number)";
  else if (starts(p, n, "\xfd" "7zXZ\x00", 6))
    what = "this is xz-compressed: decompress it first (unxz); memsnap "
           "reads gzip and zstd files directly";
  else if (n >= 4 && starts(p, n, "BZh", 3) && p[3] >= '1' && p[3] <= '9')
    what = "this is bzip2-compressed: decompress it first (bunzip2); "
           "memsnap reads gzip and zstd files directly";
  else if (starts(p, n, "\x04\x22\x4d\x18", 4))
    what = "this is lz4-compressed: decompress it first (unlz4); memsnap "
           "reads gzip and zstd files directly";
  else if (starts(p, n, "\x7f" "ELF", 4))
    what = "this is an ELF executable or shared library";
  else if (starts(p, n, "\x89PNG", 4))
    what = "this is a PNG image";
  else if (starts(p, n, "%PDF", 4))
    what = "this is a PDF document";
  else if (starts_ci(p, n, "<!doctype html") || starts_ci(p, n, "<html"))
    what = "this is an HTML page (the output of memsnap view or of "
           "_memory_viz trace_plot?)";
  else if (starts_ci(p, n, "<svg") || starts_ci(p, n, "<?xml"))
    what = "this is an XML/SVG document (the output of memsnap plot?)";
  if (what) {
    snprintf(out, len, "not a snapshot pickle: %s", what);
    return true;
  }
  /* JSON (memsnap convert --json, or any JSON) starts with '{' or '['
   * after blanks; neither byte is a pickle opcode */
  size_t ws = 0;
  while (ws < n && (p[ws] == ' ' || p[ws] == '\t' || p[ws] == '\n' ||
                    p[ws] == '\r'))
    ws++;
  if (ws < n && (p[ws] == '{' || p[ws] == '[')) {
    *at = ws;
    snprintf(out, len,
             "not a pickle: this looks like JSON (memsnap convert --json "
             "output cannot be read back; use the pickle)");
    return true;
  }
  return false;
}

/*
 * When the reader failed early: true (with a description) when the first
 * bytes p[0..n) look like text -- printable UTF-8, tabs and line breaks,
 * no NUL -- quoting the first line.
 */
bool msnap__identify_text(const unsigned char *p, size_t n, char *out,
                          size_t len) {
  if (n == 0) return false;
  size_t lim = n;
  for (size_t i = 0; i < lim; i++) {
    unsigned char c = p[i];
    if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') return false;
    if (c == 0x7f) return false;
  }
  /* the bytes >= 0x80 must form UTF-8 sequences (a cut at the end is
   * fine) */
  for (size_t i = 0; i < lim;) {
    unsigned char c = p[i];
    size_t k = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3
                              : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (k == 0) return false;
    for (size_t j = 1; j < k && i + j < lim; j++)
      if ((p[i + j] & 0xc0) != 0x80) return false;
    i += k;
  }
  char first[48];
  size_t k = 0;
  for (size_t i = 0; i < lim && k + 1 < sizeof first && p[i] != '\n'; i++)
    first[k++] = (p[i] == '\t' || p[i] == '\r' || p[i] >= 0x80) ? '?'
                                                                : (char)p[i];
  first[k] = 0;
  snprintf(out, len,
           "not a pickle: this looks like a text file (it begins \"%s%s\")",
           first, k + 1 >= sizeof first ? "..." : "");
  return true;
}
