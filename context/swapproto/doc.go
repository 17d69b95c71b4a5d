// Package swapproto is the wire codec of the migswap control protocol, version 1:
// the newline-delimited JSON spoken between libmigswap.so (the LD_PRELOAD shim)
// and the node daemon over a Unix stream socket. The protocol itself is defined
// in shim/PROTOCOL.md; this package only frames, encodes and decodes it.
//
// Contract:
//   - One Message is one JSON object on one line, at most MaxLine bytes before
//     the '\n'. Reader.Read rejects longer lines with ErrLineTooLong after
//     discarding them, so the stream stays usable.
//   - Unknown fields are ignored. Unknown types decode without error; the caller
//     answers them with an error message (see Message.Known).
//   - Ids are opaque: whatever JSON scalar the starting side chose is echoed
//     back unchanged (ID keeps the raw token). The daemon chooses integers.
//   - device may be a JSON string (a GPU or MIG UUID) or a number (an ordinal);
//     both decode into Device as text.
//
// Reader is not safe for concurrent use; Writer is (one mutex per connection).
package swapproto
