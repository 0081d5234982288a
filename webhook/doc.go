// Package webhook signs and delivers events to the HTTP endpoints tenants
// register, and verifies them on the receiving side.
//
// Signatures follow the Standard Webhooks specification by default
// (webhook-id, webhook-timestamp, webhook-signature "v1,<base64 HMAC-SHA256
// of id.timestamp.body>", "whsec_" secrets), so a receiver can verify with
// that specification's libraries in any language; SchemeTimestampFirst
// ("t1", over timestamp.id.body) is offered for receivers built on the
// earlier layout.
//
// # Guarantees
//
//   - Sign produces a fresh timestamp and signature per call, over exactly the
//     bytes given; during a rotation every active key signs, and the key ids
//     may travel in KeyIDHeader.
//   - Verify compares MACs in constant time (hmac.Equal), enforces the
//     timestamp window in both directions, and never accepts a signature of
//     another scheme or made over other bytes.
//
// # Decisions
//
//   - Garbage in one signature entry is skipped, not fatal: a header may hold
//     several entries (rotation, versions) and another may match, as in the
//     Standard Webhooks libraries.
//   - Timestamps are whole Unix seconds of at most 12 digits; anything else is
//     malformed, so no spelling of a number can overflow.
package webhook
