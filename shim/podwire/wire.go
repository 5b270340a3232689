package podwire

import (
	"errors"

	"google.golang.org/protobuf/encoding/protowire"
)

var errUnexpected = errors.New("podwire: not the message expected")

// fields calls fn with each field of the message b: its number, wire type and value (for
// protowire.BytesType the bytes inside the length, else the encoded value), in order; it
// stops at the first error. A group, or a malformed or truncated field, is an error.
func fields(b []byte, fn func(num int, typ protowire.Type, v []byte) error) error {
	for pos := 0; pos < len(b); {
		num, typ, v, n := field(b[pos:])
		if n < 0 {
			return errUnexpected
		}
		if err := fn(num, typ, v); err != nil {
			return err
		}
		pos += n
	}
	return nil
}

// field reads the field that b starts with: its number, wire type, value, and its length
// in b (negative when b does not start with a well-formed field this package reads).
func field(b []byte) (num int, typ protowire.Type, v []byte, n int) {
	number, typ, keyLen := protowire.ConsumeTag(b)
	if keyLen < 0 {
		return 0, 0, nil, -1
	}
	var valLen int
	switch typ {
	case protowire.BytesType:
		v, valLen = protowire.ConsumeBytes(b[keyLen:])
	case protowire.VarintType, protowire.Fixed32Type, protowire.Fixed64Type:
		valLen = protowire.ConsumeFieldValue(number, typ, b[keyLen:])
		if valLen >= 0 {
			v = b[keyLen : keyLen+valLen]
		}
	default: // groups: not in Kubernetes' messages
		return 0, 0, nil, -1
	}
	if valLen < 0 {
		return 0, 0, nil, -1
	}
	return int(number), typ, v, keyLen + valLen
}
