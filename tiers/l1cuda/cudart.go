package l1cuda

import (
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"
)

// defaultCUDALibraries are the names the cuda pool tries, in order, when
// its config names no library: the unversioned development link, then the
// runtimes of CUDA 13, 12 and 11.
var defaultCUDALibraries = []string{"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"}

// DefaultCUDALibraries returns the library names the cuda pool tries when
// its config names none.
func DefaultCUDALibraries() []string { return append([]string(nil), defaultCUDALibraries...) }

// ErrNoCUDA means the CUDA runtime library could not be loaded or lacks a
// function the pool needs.
var ErrNoCUDA = errors.New("cuda runtime not available")

// cudaMemcpyKind values of the runtime API.
const (
	cudaMemcpyHostToDevice = 1
	cudaMemcpyDeviceToHost = 2

	cudaSuccess        = 0
	cudaErrorNotReady  = 600
	cudaHostRegDefault = 0
	cudaStreamNonBlock = 1
	cudaEventNoTiming  = 2
	cudaIpcLazyEnable  = 1
)

// ipcMemHandle is cudaIpcMemHandle_t: 64 opaque bytes passed by value.
type ipcMemHandle struct{ reserved [64]byte }

// cudart is the subset of the CUDA runtime API the pool calls, bound at
// run time. Every function returns a cudaError_t.
type cudart struct {
	lib  uintptr
	name string

	getDeviceCount    func(count *int32) int32
	setDevice         func(dev int32) int32
	malloc            func(ptr *uintptr, size uintptr) int32
	free              func(ptr uintptr) int32
	hostRegister      func(ptr unsafe.Pointer, size uintptr, flags uint32) int32
	hostUnregister    func(ptr unsafe.Pointer) int32
	ipcOpenMemHandle  func(ptr *uintptr, h ipcMemHandle, flags uint32) int32
	ipcCloseMemHandle func(ptr uintptr) int32
	streamCreate      func(s *uintptr, flags uint32) int32
	streamDestroy     func(s uintptr) int32
	memcpy            func(dst, src uintptr, n uintptr, kind int32) int32
	memcpy2DAsync     func(dst, dpitch, src, spitch, width, height uintptr, kind int32, s uintptr) int32
	eventCreate       func(e *uintptr, flags uint32) int32
	eventRecord       func(e, s uintptr) int32
	eventSynchronize  func(e uintptr) int32
	eventDestroy      func(e uintptr) int32
	deviceSynchronize func() int32
	getErrorString    func(code int32) string
	mallocHost        func(ptr *unsafe.Pointer, size uintptr) int32
	freeHost          func(ptr unsafe.Pointer) int32
}

// loadCUDA opens the first library of names that loads and binds every
// function the pool needs. Its error names every library it tried.
func loadCUDA(names []string) (*cudart, error) {
	if len(names) == 0 {
		names = defaultCUDALibraries
	}
	var tried []string
	for _, name := range names {
		lib, err := purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_LOCAL)
		if err != nil {
			tried = append(tried, fmt.Sprintf("%s (%v)", name, err))
			continue
		}
		rt := &cudart{lib: lib, name: name}
		if err := rt.bind(); err != nil {
			purego.Dlclose(lib)
			tried = append(tried, fmt.Sprintf("%s (%v)", name, err))
			continue
		}
		return rt, nil
	}
	return nil, fmt.Errorf("load the CUDA runtime: looked for %s: %w", strings.Join(tried, "; "), ErrNoCUDA)
}

// bind registers each function, turning a missing symbol (or a signature
// purego refuses, which it reports by panicking) into an error.
func (rt *cudart) bind() (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("bind: %v", r)
		}
	}()
	for _, f := range []struct {
		ptr  any
		name string
	}{
		{&rt.getDeviceCount, "cudaGetDeviceCount"},
		{&rt.setDevice, "cudaSetDevice"},
		{&rt.malloc, "cudaMalloc"},
		{&rt.free, "cudaFree"},
		{&rt.hostRegister, "cudaHostRegister"},
		{&rt.hostUnregister, "cudaHostUnregister"},
		{&rt.ipcOpenMemHandle, "cudaIpcOpenMemHandle"},
		{&rt.ipcCloseMemHandle, "cudaIpcCloseMemHandle"},
		{&rt.streamCreate, "cudaStreamCreateWithFlags"},
		{&rt.streamDestroy, "cudaStreamDestroy"},
		{&rt.memcpy, "cudaMemcpy"},
		{&rt.memcpy2DAsync, "cudaMemcpy2DAsync"},
		{&rt.eventCreate, "cudaEventCreateWithFlags"},
		{&rt.eventRecord, "cudaEventRecord"},
		{&rt.eventSynchronize, "cudaEventSynchronize"},
		{&rt.eventDestroy, "cudaEventDestroy"},
		{&rt.deviceSynchronize, "cudaDeviceSynchronize"},
		{&rt.getErrorString, "cudaGetErrorString"},
		{&rt.mallocHost, "cudaMallocHost"},
		{&rt.freeHost, "cudaFreeHost"},
	} {
		if _, err := purego.Dlsym(rt.lib, f.name); err != nil {
			return fmt.Errorf("symbol %s: %w", f.name, err)
		}
		purego.RegisterLibFunc(f.ptr, rt.lib, f.name)
	}
	return nil
}

// check turns a cudaError_t into an error naming the call.
func (rt *cudart) check(call string, code int32) error {
	if code == cudaSuccess {
		return nil
	}
	return fmt.Errorf("%s: cuda error %d (%s)", call, code, rt.getErrorString(code))
}
