/* A process, and the processes it starts, that Linux does not grant AMX's tile state: the arch_prctl request for it
 * (ARCH_REQ_XCOMP_PERM) fails, as on a Linux before 5.16, so that every library in it (hotrod's kernels,
 * onnxruntime's MLAS, OpenVINO's oneDNN, PyTorch's) takes the path it takes on a CPU without AMX (AVX-512 VNNI,
 * AVX-512 BF16, AVX2): a measurement of those paths on a CPU that has AMX, all libraries alike. Loaded with
 * LD_PRELOAD (benchmarks/without_amx.sh); it interposes libc's syscall(), which they all call for the request. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <sys/syscall.h>

#define ARCH_REQ_XCOMP_PERM 0x1023

long syscall(long number, ...) {
  va_list list;
  long args[6];
  va_start(list, number);
  for (int i = 0; i < 6; i++) args[i] = va_arg(list, long);
  va_end(list);
  if (number == SYS_arch_prctl && args[0] == ARCH_REQ_XCOMP_PERM) {
    errno = EINVAL; /* what a kernel without the request answers */
    return -1;
  }
  static long (*libc)(long, ...) = 0;
  if (libc == 0) libc = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
  return libc(number, args[0], args[1], args[2], args[3], args[4], args[5]);
}
