package registry

import "fmt"

// FieldError is a module config's validation error about one field. Field
// is the field's YAML path inside the module's config block ("size",
// "disks[1].dir"); a stack loader that finds a FieldError in a Validate
// error (errors.As) reports the error at that field's line instead of at
// the block. The message is Err's, unchanged: it names the field itself.
type FieldError struct {
	// Field is the YAML path of the field relative to the module's config.
	Field string
	// Err says what is wrong.
	Err error
}

// Error returns Err's message.
func (e *FieldError) Error() string { return e.Err.Error() }

// Unwrap returns Err.
func (e *FieldError) Unwrap() error { return e.Err }

// FieldErrorf returns a *FieldError about field with a formatted message
// (fmt.Errorf: %w wraps).
func FieldErrorf(field, format string, args ...any) error {
	return &FieldError{Field: field, Err: fmt.Errorf(format, args...)}
}
