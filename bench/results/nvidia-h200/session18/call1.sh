#!/usr/bin/env bash
# Session 18 call 1 (main at a18ae65, the code of session 17 call 5): session 17's call 6, run as is
# (the Python package, pytest on CUDA, the SAM cases against cuDNN and the rel-pos cases against
# compiled Flex).
exec bash "$(dirname "$0")/../session17/call6.sh"
