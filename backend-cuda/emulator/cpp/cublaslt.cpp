extern "C" int lockstep_cublaslt_emulated() { return 1; }
