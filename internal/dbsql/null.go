package dbsql

// NullIfZero maps Go's zero value to SQL NULL for optional columns.
func NullIfZero[T comparable](v T) *T {
	var zero T
	if v == zero {
		return nil
	}
	return &v
}

// Deref maps a scanned SQL NULL back to Go's zero value.
func Deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
