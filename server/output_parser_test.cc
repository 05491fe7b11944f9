#include "server/output_parser.h"
