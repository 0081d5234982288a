package dbsql

// NullIfZero maps Go's zero value to SQL NULL for optional columns. It
// allocates only for a value that is not zero: returning &v would move v
// to the heap on every call, and batch statements call it per row and
// column.
func NullIfZero[T comparable](v T) *T {
	var zero T
	if v == zero {
		return nil
	}
	p := new(T)
	*p = v
	return p
}

// Deref maps a scanned SQL NULL back to Go's zero value.
func Deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
