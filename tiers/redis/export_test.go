package redis

// EncodeVersion1 writes a value in the old format (header first), for the
// tests of its refusal.
var EncodeVersion1 = encodeVersion1
