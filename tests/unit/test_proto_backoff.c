/*
 * test_proto_backoff.c -- the body of a HELLO answered KVP_EAUTH_BACKOFF
 * (kvp_msg_hello_backoff): round trip, byte layout, and what the decoder
 * refuses (the address is printed in messages: printable ASCII only).
 */
#include <string.h>

#include "common/buf.h"
#include "harness.h"
#include "kvpool.h"
#include "proto/proto.h"

TEST(hello_backoff_round_trip_and_layout)
{
    kvp_buf b;
    kvp_buf_init(&b, 4096);
    kvp_msg_hello_backoff m = {1234, {(const uint8_t *)"127.0.0.1", 9}};
    kvp_enc_hello_backoff(&b, &m);
    static const uint8_t want[] = {0xD2, 0x04, 0, 0, 9, 0, 0, 0, '1', '2', '7', '.', '0', '.', '0',
                                   '.', '1'};
    CHECK_EQ(b.len, sizeof want);
    CHECK(memcmp(b.data, want, sizeof want) == 0);
    kvp_msg_hello_backoff d;
    CHECK_EQ(kvp_dec_hello_backoff(b.data, (uint32_t)b.len, &d), 0);
    CHECK_EQ(d.retry_ms, 1234u);
    CHECK_EQ(d.addr.len, 9u);
    CHECK(memcmp(d.addr.p, "127.0.0.1", 9) == 0);
    /* every truncation fails */
    for (size_t n = 0; n < b.len; n++)
        CHECK(kvp_dec_hello_backoff(b.data, (uint32_t)n, &d) != 0);
    /* trailing bytes fail */
    kvp_buf_put(&b, "x", 1);
    CHECK(kvp_dec_hello_backoff(b.data, (uint32_t)b.len, &d) != 0);
    kvp_buf_free(&b);
}

TEST(hello_backoff_address_must_be_short_and_printable)
{
    kvp_buf b;
    kvp_buf_init(&b, 4096);
    kvp_msg_hello_backoff d;
    kvp_enc_hello_backoff(&b, &(kvp_msg_hello_backoff){5, {(const uint8_t *)"a\nb", 3}});
    CHECK(kvp_dec_hello_backoff(b.data, (uint32_t)b.len, &d) != 0);
    kvp_buf_reset(&b);
    kvp_enc_hello_backoff(&b, &(kvp_msg_hello_backoff){5, {(const uint8_t *)"a\x1b[2Jb", 6}});
    CHECK(kvp_dec_hello_backoff(b.data, (uint32_t)b.len, &d) != 0);
    char big[KVP_BACKOFF_ADDR_MAX + 1];
    memset(big, 'a', sizeof big);
    kvp_buf_reset(&b);
    kvp_enc_hello_backoff(&b, &(kvp_msg_hello_backoff){5, {(const uint8_t *)big, sizeof big}});
    CHECK(kvp_dec_hello_backoff(b.data, (uint32_t)b.len, &d) != 0);
    kvp_buf_reset(&b);
    kvp_enc_hello_backoff(&b, &(kvp_msg_hello_backoff){5, {(const uint8_t *)big, sizeof big - 1}});
    CHECK_EQ(kvp_dec_hello_backoff(b.data, (uint32_t)b.len, &d), 0);
    kvp_buf_reset(&b);
    kvp_enc_hello_backoff(&b, &(kvp_msg_hello_backoff){0, {NULL, 0}}); /* empty: allowed */
    CHECK_EQ(kvp_dec_hello_backoff(b.data, (uint32_t)b.len, &d), 0);
    CHECK_EQ(d.addr.len, 0u);
    kvp_buf_free(&b);
}
