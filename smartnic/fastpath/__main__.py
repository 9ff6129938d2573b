"""`python -m smartnic.fastpath FD`: the fast path's process, on the socket the agent passed (fd FD)."""
import sys

from smartnic.fastpath.process import main

sys.exit(main(sys.argv[1:]))
