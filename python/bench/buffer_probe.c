// What a primary buffer's kind costs the disk tier's loads, one thread, one
// request at a time: O_DIRECT reads straight into the buffer's rows, O_DIRECT
// reads into a huge-page staging piece then a copy to the row, and the copy
// alone; CPU per GB (getrusage) and minor faults beside GB/s, then the
// buffer's smaps (page size, huge pages). Kinds: anon-shared (Python's
// mmap.mmap(-1, n), the bench's [anon mmap] rows), anon-private, and
// shm-file (vLLM's SharedOffloadRegion: a /dev/shm file, MAP_SHARED,
// MADV_POPULATE_WRITE).
//
//   cc -O2 -o /tmp/buffer_probe python/bench/buffer_probe.c
//   dd if=/dev/urandom of=/var/tmp/probe.dat bs=1M count=512 oflag=direct
//   /tmp/buffer_probe shm-file /var/tmp/probe.dat 2097152 256
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void usage(double*cpu,long*minflt,long*majflt){struct rusage r;getrusage(RUSAGE_SELF,&r);
 *cpu=r.ru_utime.tv_sec+r.ru_utime.tv_usec*1e-6+r.ru_stime.tv_sec+r.ru_stime.tv_usec*1e-6;*minflt=r.ru_minflt;*majflt=r.ru_majflt;}
static char*make(const char*kind,size_t len){
 char*p;
 if(!strcmp(kind,"anon-shared")){p=mmap(0,len,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);memset(p,0,len);}
 else if(!strcmp(kind,"anon-private")){p=mmap(0,len,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);memset(p,0,len);}
 else {int fd=open("/dev/shm/m56probe",O_RDWR|O_CREAT|O_TRUNC,0600);ftruncate(fd,len);p=mmap(0,len,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0);close(fd);unlink("/dev/shm/m56probe");
  if(madvise(p,len,MADV_POPULATE_WRITE))perror("populate");}
 return p;}
int main(int argc,char**argv){
 const char*kind=argv[1];const char*file=argv[2];size_t row=strtoul(argv[3],0,0);size_t rows=strtoul(argv[4],0,0);
 size_t len=row*rows;char*buf=make(kind,len);
 char*stage=NULL;if(posix_memalign((void**)&stage,2<<20,row<(2<<20)?(2<<20):row))return 1;madvise(stage,row,MADV_HUGEPAGE);memset(stage,1,row);
 int fd=open(file,O_RDONLY|O_DIRECT);if(fd<0){perror("open");return 1;}
 for(int pass=0;pass<2;pass++){
 double c0,c1,t0,t1;long f0,f1,m0,m1;
 usage(&c0,&f0,&m0);t0=now();
 for(size_t i=0;i<rows;i++){ssize_t n=pread(fd,buf+i*row,row,(off_t)(i*row));if(n!=(ssize_t)row){perror("pread");return 1;}}
 t1=now();usage(&c1,&f1,&m1);
 printf("%s row %zu: O_DIRECT pread into region  %.2f GB/s  cpu %.0f ms/GB  minflt %ld\n",kind,row,len/(t1-t0)/1e9,(c1-c0)*1e3/(len/1e9),f1-f0);
 usage(&c0,&f0,&m0);t0=now();
 for(size_t i=0;i<rows;i++){ssize_t n=pread(fd,stage,row,(off_t)(i*row));if(n!=(ssize_t)row){perror("pread");return 1;}memcpy(buf+i*row,stage,row);}
 t1=now();usage(&c1,&f1,&m1);
 printf("%s row %zu: O_DIRECT pread into stage + memcpy  %.2f GB/s  cpu %.0f ms/GB  minflt %ld\n",kind,row,len/(t1-t0)/1e9,(c1-c0)*1e3/(len/1e9),f1-f0);
 usage(&c0,&f0,&m0);t0=now();
 for(int k=0;k<4;k++)for(size_t i=0;i<rows;i++)memcpy(buf+i*row,stage,row);
 t1=now();usage(&c1,&f1,&m1);
 printf("%s row %zu: memcpy stage->region  %.2f GB/s  cpu %.0f ms/GB\n",kind,row,4*len/(t1-t0)/1e9,(c1-c0)*1e3/(4*len/1e9));
 }
 fflush(stdout);char cmd[256];snprintf(cmd,sizeof cmd,"grep -A30 '^%lx' /proc/%d/smaps | grep -m8 -E '^(KernelPageSize|Rss|Shared_Dirty|AnonHugePages|ShmemPmdMapped|THPeligible|VmFlags)'",(unsigned long)buf,getpid());system(cmd);
 return 0;}
