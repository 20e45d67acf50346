from spanlm.cli import main

if __name__ == "__main__":  # not when a multiprocessing child imports the parent's main module
    raise SystemExit(main())
