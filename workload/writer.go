package workload

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
)

// Write writes reqs as a Mooncake FAST'25 JSONL trace, one object per line
// with the keys in the published order and the published spacing
// (`{"timestamp": 0, "input_length": 40160, ...}`), so a generated trace
// can be fed to other tools that read the format. It refuses a request that
// Reader would refuse: a negative length, a hash id count other than
// ceil(input_length/512), or a timestamp before the previous one.
func Write(w io.Writer, reqs []Request) error {
	bw := bufio.NewWriterSize(w, 256<<10)
	buf := make([]byte, 0, 4096)
	for i, req := range reqs {
		if err := req.Validate(); err != nil {
			return fmt.Errorf("write trace: request %d: %w", i, err)
		}
		if i > 0 && req.Timestamp < reqs[i-1].Timestamp {
			return fmt.Errorf("write trace: request %d: timestamp %d is before %d: %w", i, req.Timestamp, reqs[i-1].Timestamp, ErrMalformed)
		}
		buf = appendRequest(buf[:0], req)
		if _, err := bw.Write(buf); err != nil {
			return fmt.Errorf("write trace: request %d: %w", i, err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write trace: %w", err)
	}
	return nil
}

func appendRequest(b []byte, req Request) []byte {
	b = append(b, `{"timestamp": `...)
	b = strconv.AppendInt(b, req.Timestamp, 10)
	b = append(b, `, "input_length": `...)
	b = strconv.AppendInt(b, int64(req.InputLength), 10)
	b = append(b, `, "output_length": `...)
	b = strconv.AppendInt(b, int64(req.OutputLength), 10)
	b = append(b, `, "hash_ids": [`...)
	for i, id := range req.HashIDs {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = strconv.AppendUint(b, id, 10)
	}
	return append(b, "]}\n"...)
}
