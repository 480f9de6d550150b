from euclip_bench.cli import main

main()
