/* The JSON string writer; the contract is in kp_json.h. */
#include "kp_json.h"

#include <string.h>

/* 1 for the ASCII bytes that need an escape. A table rather than a chain of compares: this
 * is the inner loop of export. */
static const unsigned char ascii_esc[128] = {
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,         1,          1,          1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, ['"'] = 1, ['\\'] = 1, [0x7f] = 1,
};

size_t kp_utf8_seq_len(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *) str;
    unsigned char c = s[0];

    if (c >= 0xc2 && c <= 0xdf) {
        return n >= 2 && (s[1] & 0xc0) == 0x80 ? 2 : 0;
    }
    if (c >= 0xe0 && c <= 0xef) {
        if (n < 3 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80) {
            return 0;
        }
        /* no overlong forms (< U+0800), no surrogates (U+D800..U+DFFF) */
        if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] >= 0xa0)) {
            return 0;
        }
        return 3;
    }
    if (c >= 0xf0 && c <= 0xf4) {
        if (n < 4 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80 || (s[3] & 0xc0) != 0x80) {
            return 0;
        }
        /* no overlong forms (< U+10000), nothing past U+10FFFF */
        if ((c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] >= 0x90)) {
            return 0;
        }
        return 4;
    }
    return 0;
}

size_t kp_json_plain_len(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *) s;
    size_t i = 0;

    while (i < n) {
        unsigned char c = p[i];

        if (c < 0x80) {
            if (ascii_esc[c]) {
                break;
            }
            i++;
        }
        else {
            size_t k = kp_utf8_seq_len(s + i, n - i);

            if (k == 0) {
                break;
            }
            i += k;
        }
    }
    return i;
}

size_t kp_json_escape(unsigned char c, char esc[KP_JSON_ESCAPE_MAX])
{
    static const char hex[] = "0123456789abcdef";

    esc[0] = '\\';
    switch (c) {
    case '"':
    case '\\':
        esc[1] = (char) c;
        return 2;
    case '\n':
        esc[1] = 'n';
        return 2;
    case '\r':
        esc[1] = 'r';
        return 2;
    case '\t':
        esc[1] = 't';
        return 2;
    default:
        break;
    }
    if (c >= 0x80) {
        memcpy(esc + 1, "ufffd", 5);
        return 6;
    }
    esc[1] = 'u';
    esc[2] = '0';
    esc[3] = '0';
    esc[4] = hex[c >> 4];
    esc[5] = hex[c & 0xf];
    return 6;
}

void kp_json_fput(FILE *f, const char *s, size_t n)
{
    char esc[KP_JSON_ESCAPE_MAX];

    fputc('"', f);
    while (n > 0) {
        size_t k = kp_json_plain_len(s, n);

        fwrite(s, 1, k, f);
        if (k == n) {
            break;
        }
        fwrite(esc, 1, kp_json_escape((unsigned char) s[k], esc), f);
        s += k + 1;
        n -= k + 1;
    }
    fputc('"', f);
}

void kp_json_fputs(FILE *f, const char *s)
{
    kp_json_fput(f, s, strlen(s));
}

int kp_json_append_chars(struct kp_strbuf *sb, const char *s, size_t n)
{
    char esc[KP_JSON_ESCAPE_MAX];
    int rc = 0;

    while (rc == 0 && n > 0) {
        size_t k = kp_json_plain_len(s, n);

        rc = kp_strbuf_append(sb, s, k);
        if (rc != 0 || k == n) {
            break;
        }
        rc = kp_strbuf_append(sb, esc, kp_json_escape((unsigned char) s[k], esc));
        s += k + 1;
        n -= k + 1;
    }
    return rc;
}

int kp_json_append(struct kp_strbuf *sb, const char *s, size_t n)
{
    int rc = kp_strbuf_putc(sb, '"');

    rc = rc != 0 ? rc : kp_json_append_chars(sb, s, n);
    return rc != 0 ? rc : kp_strbuf_putc(sb, '"');
}
