/* The JPEG check of `tessera ingest`: libjpeg-turbo decodes the whole file at 1/8 scale
 * (DCT scaling: every entropy-coded bit is read, so truncated or corrupt data fails, while
 * most of the inverse DCT and the colour conversion are skipped), as PIL's draft mode does.
 *
 * libjpeg reports fatal errors through error_exit, which must not return: here it longjmps
 * back into tessera_jpeg_check, the only function that calls into libjpeg, so no Rust frame
 * is ever crossed. Damage libjpeg only warns about and works around (data cut short, a bad
 * Huffman code, a marker inside the entropy-coded data) fails the check as well; bytes
 * between marker segments, which other decoders skip too, do not. */
#include <setjmp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>

struct check_error {
  struct jpeg_error_mgr pub;
  jmp_buf jump;
  int damaged;
  char message[JMSG_LENGTH_MAX];
};

static void on_error(j_common_ptr cinfo) {
  struct check_error *err = (struct check_error *)cinfo->err;
  (*cinfo->err->format_message)(cinfo, err->message);
  longjmp(err->jump, 1);
}

static int is_damage(int code) {
  switch (code) {
    case JWRN_JPEG_EOF:
    case JWRN_HIT_MARKER:
    case JWRN_HUFF_BAD_CODE:
    case JWRN_MUST_RESYNC:
    case JWRN_NOT_SEQUENTIAL:
    case JWRN_BOGUS_PROGRESSION:
      return 1;
    default:
      return 0;
  }
}

static void on_message(j_common_ptr cinfo, int level) {
  struct check_error *err = (struct check_error *)cinfo->err;
  if (level >= 0) {
    return; /* trace messages */
  }
  cinfo->err->num_warnings++;
  if (!err->damaged && is_damage(cinfo->err->msg_code)) {
    err->damaged = 1;
    (*cinfo->err->format_message)(cinfo, err->message);
  }
}

/* Decodes `len` bytes at `data` at 1/8 scale. Returns 0 when the file decodes whole and
 * undamaged, 1 otherwise with the reason in `message` (NUL-terminated, cut to `cap` bytes),
 * -1 when memory ran out. */
int tessera_jpeg_check(const unsigned char *data, unsigned long len, char *message,
                       size_t cap) {
  struct jpeg_decompress_struct cinfo;
  struct check_error err;
  JSAMPLE *volatile rows = NULL;
  volatile int result = 0;
  volatile int created = 0;
  memset(&err, 0, sizeof err);
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = on_error;
  err.pub.emit_message = on_message;
  if (setjmp(err.jump)) {
    result = 1;
    goto done;
  }
  jpeg_create_decompress(&cinfo);
  created = 1;
  jpeg_mem_src(&cinfo, data, len);
  jpeg_read_header(&cinfo, TRUE);
  cinfo.scale_num = 1;
  cinfo.scale_denom = 8;
  cinfo.dct_method = JDCT_IFAST;
  cinfo.do_fancy_upsampling = FALSE;
  cinfo.do_block_smoothing = FALSE;
  jpeg_start_decompress(&cinfo);
  {
    size_t stride = (size_t)cinfo.output_width * (size_t)cinfo.output_components;
    int lines = cinfo.rec_outbuf_height > 0 ? cinfo.rec_outbuf_height : 1;
    JSAMPROW pointers[16];
    int i;
    if (lines > 16) {
      lines = 16;
    }
    rows = (JSAMPLE *)malloc(stride * (size_t)lines + 1);
    if (rows == NULL) {
      result = -1;
      snprintf(err.message, sizeof err.message, "out of memory");
      goto done;
    }
    for (i = 0; i < lines; i++) {
      pointers[i] = rows + stride * (size_t)i;
    }
    while (cinfo.output_scanline < cinfo.output_height) {
      jpeg_read_scanlines(&cinfo, pointers, (JDIMENSION)lines);
    }
  }
  jpeg_finish_decompress(&cinfo);
  if (err.damaged) {
    result = 1;
  }
done:
  if (created) {
    jpeg_destroy_decompress(&cinfo);
  }
  free((void *)rows);
  if (result != 0 && cap > 0) {
    strncpy(message, err.message, cap - 1);
    message[cap - 1] = '\0';
  }
  return result;
}
